"""``offmeta data``: exit codes and output, called in-process through ``flows.cli.main``."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

import flows.cli
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table, tensor, write


@pytest.fixture(autouse=True)
def _only_data_commands(monkeypatch):
    # The data group is tested on its own; the other groups have their own tests.
    monkeypatch.setattr(flows.cli, "_GROUPS", ("data",))


def test_generate_then_validate(tmp_path, capsys):
    out = tmp_path / "sin"
    argv = ["data", "generate", "sinusoid", "--tasks", "5", "--heldout-tasks", "2"]
    assert flows.cli.main([*argv, "--points", "4", "--seed", "7", "--out", str(out)]) == 0
    generated = capsys.readouterr()
    assert generated.err.splitlines() == [
        "sinusoid train: wrote part-00000.parquet (1/1 files, 5/5 tasks, 20 rows)",
        "sinusoid heldout: wrote part-00000.parquet (1/1 files, 2/2 tasks, 8 rows)",
    ]
    assert "train: OK" in generated.out and "heldout: OK" in generated.out

    assert flows.cli.main(["data", "validate", str(out / "train")]) == 0
    shown = capsys.readouterr()
    fingerprint = inspect_episodes(out / "train").fingerprint
    assert shown.err == ""
    assert shown.out.splitlines() == [
        f"{out / 'train'}: OK",
        "  id                sinusoid",
        "  split             train",
        f"  root              {out / 'train'}",
        "  files             1",
        "  rows              20",
        "  episodes          5",
        "  tasks             5",
        '  modules           ["default_policy"]',
        "  obs_shape         [1]",
        "  action_shape      [1]",
        "  discrete_actions  false",
        f"  fingerprint       {fingerprint}",
    ]


def test_validate_json_and_column_map(tmp_path, capsys):
    table = episode_table().rename_columns(
        ["episode", "t", "observation", "actions", "rewards", "terminateds", "truncateds", "task"]
    )
    path = write(tmp_path / "custom.parquet", table)
    argv = ["data", "validate", str(path), "--json"]
    maps = ["--column-map", "eps_id=episode", "--column-map", "obs=observation"]
    assert flows.cli.main([*argv, *maps, "--column-map", "task_id=task"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["rows"] == 6 and summary["episodes"] == 2 and summary["tasks"] == 2


def test_validate_refuses_with_message_and_exit_code_1(tmp_path, capsys):
    path = write(tmp_path / "part.parquet", episode_table(rewards=None))
    good = write(tmp_path / "good" / "part.parquet", episode_table())

    assert flows.cli.main(["data", "validate", str(path), str(good.parent)]) == 1

    shown = capsys.readouterr()
    assert shown.err == (
        f"offmeta data validate: {path}: missing required column 'rewards'; found columns "
        "eps_id, t, obs, actions, terminateds, truncateds, task_id. Fix: add it, or map it "
        "with column_map={'rewards': '<name on disk>'} (--column-map rewards=<name on disk>)\n"
    )
    assert "Traceback" not in shown.out + shown.err
    assert shown.out.startswith(f"{good.parent}: OK\n")


def test_validate_refuses_a_null_observation(tmp_path, capsys):
    obs = episode_table().column("obs").combine_chunks()
    storage = pa.FixedSizeListArray.from_arrays(
        obs.storage.values, 3, mask=pa.array([False, False, False, False, True, False])
    )
    table = episode_table(obs=pa.ExtensionArray.from_storage(obs.type, storage))
    path = write(tmp_path / "part.parquet", table)

    assert flows.cli.main(["data", "validate", str(path)]) == 1

    assert capsys.readouterr().err == (
        f"offmeta data validate: {path}: column 'obs' has nulls in 1 of 6 rows; expected a "
        "value in every row of every canonical column. Fix: drop or fill those rows\n"
    )


def test_validate_allows_partial_episodes_only_when_asked(tmp_path, capsys):
    steps = pa.array([0, 1, 2, 0, 2, 3], pa.int32())
    path = write(tmp_path / "part.parquet", episode_table(t=steps))

    assert flows.cli.main(["data", "validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"offmeta data validate: {path}: eps_id 1 jumps from t 0 to t 2; expected consecutive "
        "steps within an episode. Fix: write the missing steps, or pass "
        "allow_partial_episodes=True (--allow-partial-episodes, data.allow_partial_episodes) "
        "for a dataset that is knowingly partial\n"
    )

    argv = ["data", "validate", str(path), "--allow-partial-episodes", "--json"]
    assert flows.cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2


def test_validate_within_a_memory_budget_finds_the_same(tmp_path, capsys):
    steps = pa.array([0, 1, 2, 0, 2, 3], pa.int32())
    path = write(tmp_path / "part.parquet", episode_table(t=steps))
    assert flows.cli.main(["data", "validate", str(path)]) == 1
    in_memory = capsys.readouterr().err

    assert flows.cli.main(["data", "validate", str(path), "--validation-memory-mb", "1e-6"]) == 1
    assert capsys.readouterr().err == in_memory

    with pytest.raises(SystemExit) as usage:
        flows.cli.main(["data", "validate", str(path), "--validation-memory-mb", "0"])
    assert usage.value.code == 2
    assert capsys.readouterr().err.endswith(
        "offmeta data validate: error: argument --validation-memory-mb: expected a number of MB "
        "above 0, got '0'\n"
    )


def test_validate_refuses_non_finite_values_unless_told_not_to_check(tmp_path, capsys):
    rewards = pa.array([0, 1, 2, 3, float("nan"), float("inf")], pa.float32())
    path = write(tmp_path / "part.parquet", episode_table(rewards=rewards))

    assert flows.cli.main(["data", "validate", str(path)]) == 1
    assert capsys.readouterr().err == (
        f"offmeta data validate: {path}: column 'rewards' has non-finite values (NaN or inf) "
        "in 2 of 6 rows, first at eps_id 1 t 1; expected finite numbers in every row. Fix: "
        "drop the episodes holding them or repair the values where they were recorded\n"
    )
    assert flows.cli.main(["data", "validate", str(path), "--check-values", "sample"]) == 1
    capsys.readouterr()
    assert flows.cli.main(["data", "validate", str(path), "--check-values", "off"]) == 0
    assert capsys.readouterr().out.startswith(f"{path}: OK\n")


def test_validate_refuses_discrete_actions_outside_the_action_space(tmp_path, capsys):
    actions = pa.array([0, 1, 2, 1, 0, 1], pa.int64())
    path = write(tmp_path / "part.parquet", episode_table(action_dim=None, actions=actions))
    space = {"kind": "discrete", "n": 2}
    (tmp_path / "dataset.json").write_text(json.dumps({"id": "tiny", "action_space": space}))

    assert flows.cli.main(["data", "validate", str(tmp_path)]) == 1
    assert capsys.readouterr().err == (
        f"offmeta data validate: {path}: column 'actions' has actions outside [0, 2) in 1 of 6 "
        "rows, first at eps_id 0 t 2 (action 2); expected 0 <= action < 2 as the discrete "
        f"action_space (n: 2) in {tmp_path / 'dataset.json'} declares. Fix: correct the "
        "actions or action_space.n\n"
    )


def test_validate_warns_of_actions_outside_a_box(tmp_path, capsys):
    actions = np.zeros((6, 2), np.float32)
    actions[3, 1] = 2.0
    path = write(tmp_path / "part.parquet", episode_table(actions=tensor(actions)))
    space = {"kind": "box", "shape": [2], "low": -1, "high": 1}
    (tmp_path / "dataset.json").write_text(json.dumps({"id": "tiny", "action_space": space}))

    assert flows.cli.main(["data", "validate", str(tmp_path), "--json"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["actions_outside_box"] == 1
    assert shown.err == (
        "offmeta data validate: warning: column 'actions' has components outside "
        f"action_space's bounds [-1.0, 1.0] ({tmp_path / 'dataset.json'}) in 1 of 6 rows, "
        f"first in {path} at eps_id 1 t 0; kept as recorded (recorders often store actions "
        "before the environment clips them)\n"
    )


def test_malformed_column_map_option(tmp_path, capsys):
    path = write(tmp_path / "part.parquet", episode_table())
    assert flows.cli.main(["data", "validate", str(path), "--column-map", "obs"]) == 1
    assert capsys.readouterr().err == (
        "offmeta data validate: --column-map 'obs': expected CANONICAL=DISK, e.g. "
        "--column-map obs=observation\n"
    )


def test_generate_refuses_a_used_directory(tmp_path, capsys):
    (tmp_path / "heldout").mkdir()
    (tmp_path / "heldout" / "keep.txt").write_text("mine")
    argv = ["data", "generate", "point_robot", "--tasks", "2", "--out", str(tmp_path)]
    assert flows.cli.main(argv) == 1
    assert capsys.readouterr().err == (
        f"offmeta data generate: {tmp_path / 'heldout'} already holds files; expected a new "
        "or empty directory (delete it to regenerate)\n"
    )
    assert not (tmp_path / "train").exists()


def test_unknown_generator_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        flows.cli.main(["data", "generate", "cartpole", "--out", "x"])
    assert caught.value.code == 2
    assert "invalid choice: 'cartpole'" in capsys.readouterr().err
