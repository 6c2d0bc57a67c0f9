"""Recording ML1 datasets: the canonical layout with the goal hidden, each goal's behaviours,
``success`` passed through, task parameters that rebuild the environment, the same bytes from
the same arguments, and one-line refusals of bad arguments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.benchmarks.metaworld_env import ml1_env
from pipeline.benchmarks.metaworld_record import ML1Episodes, main, record
from pipeline.benchmarks.metaworld_tasks import GOAL_SLICE
from pipeline.reads.episodes import inspect_episodes

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # metaworld's policy gains

TINY = {"train_goals": 2, "heldout_goals": 1, "seed": 0}


def tiny_family() -> ML1Episodes:
    return ML1Episodes(env="reach-v3", episodes_per_goal=2, max_steps=10, noise=(0.1,))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("ml1")
    record(tiny_family(), out, **TINY)
    return out


def test_recorded_splits_hold_the_goal_hidden_and_each_behaviour(recorded: Path) -> None:
    train = inspect_episodes(recorded / "train")
    assert (train.num_rows, train.num_episodes) == (2 * 2 * 10, 4)
    table = pq.read_table(recorded / "train" / "part-00000.parquet")
    obs = np.stack(table.column("obs").to_pylist())
    assert obs.shape == (40, 39) and not obs[:, GOAL_SLICE].any()
    assert table.column("behavior").to_pylist()[::10] == ["noise_0.1", "random"] * 2
    assert table.column("success").type == "bool"
    assert table.column("truncateds").to_pylist()[9::10] == [True] * 4
    actions = np.stack(table.column("actions").to_pylist())
    assert np.abs(actions).max() <= 1.0
    metadata = json.loads((recorded / "heldout" / "dataset.json").read_text())
    (params,) = metadata["tasks"].values()
    assert params["env_name"] == "reach-v3" and len(params["rand_vec"]) == 6
    assert params["behaviors"] == ["noise_0.1", "random"]
    assert metadata["generator"]["args"]["heldout_goals"] == 1


def test_train_and_heldout_goals_differ(recorded: Path) -> None:
    goals = {
        split: [
            t["goal"]
            for t in json.loads((recorded / split / "dataset.json").read_text())["tasks"].values()
        ]
        for split in ("train", "heldout")
    }
    assert not set(map(tuple, goals["heldout"])) & set(map(tuple, goals["train"]))


def test_the_task_params_rebuild_the_recorded_environment(recorded: Path) -> None:
    metadata = json.loads((recorded / "train" / "dataset.json").read_text())
    task_id, params = next(iter(metadata["tasks"].items()))
    env = ml1_env(task_id, params, max_steps=10)
    first, info = env.reset()
    table = pq.read_table(recorded / "train" / "part-00000.parquet")
    assert first.dtype == np.float32
    np.testing.assert_array_equal(first, np.asarray(table.column("obs")[0].as_py(), np.float32))
    np.testing.assert_allclose(info["goal"], params["goal"][:2], atol=1e-6)
    assert info["expert_action"].shape == (4,)
    env.close()


def test_the_same_arguments_write_the_same_bytes(recorded: Path, tmp_path: Path) -> None:
    record(tiny_family(), tmp_path, **TINY)
    for split in ("train", "heldout"):
        for name in ("part-00000.parquet", "dataset.json"):
            assert (tmp_path / split / name).read_bytes() == (recorded / split / name).read_bytes()


def test_the_expert_given_the_goal_reaches_it(recorded: Path) -> None:
    metadata = json.loads((recorded / "heldout" / "dataset.json").read_text())
    task_id, params = next(iter(metadata["tasks"].items()))
    env = ml1_env(task_id, params, max_steps=150)
    _, info = env.reset()
    succeeded = False
    for _ in range(150):
        _, _, _, truncated, info = env.step(info["expert_action"])
        succeeded |= bool(info["success"])
    assert succeeded and truncated


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--env", "reach-v9"],
            "error: Meta-World has no environment 'reach-v9'; expected one of ML1's, e.g. "
            "reach-v3, push-v3",
        ),
        (
            ["--train-goals", "51"],
            "error: train goals must be between 1 and 50 (ML1 has 50), got 51",
        ),
        (["--max-steps", "501"], "error: max_steps must be between 1 and 500, got 501"),
        (["--noise", "-1"], "error: noise levels must be >= 0, got [-1.0]"),
        (
            ["--noise", "", "--no-random"],
            "error: no behaviour: give a noise level or keep the random policy",
        ),
    ],
)
def test_bad_arguments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main([*argv, "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err.strip() == message
    assert not (tmp_path / "out").exists()


def test_an_output_that_holds_files_is_refused(recorded: Path, capsys) -> None:
    assert main(["--env", "reach-v3", "--out", str(recorded)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"error: {recorded / 'train'} already holds files; expected a new or empty directory "
        "(delete it to regenerate)"
    )


def test_params_without_a_rand_vec_are_refused() -> None:
    with pytest.raises(ValueError) as raised:
        ml1_env("heldout-00000", {"env_name": "reach-v3"})
    assert str(raised.value) == (
        "Meta-World task 'heldout-00000': params have no 'rand_vec'; expected the task's entry "
        "in dataset.json 'tasks' as pipeline.benchmarks.metaworld_record writes it"
    )
