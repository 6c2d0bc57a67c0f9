"""``offmeta data``: exit codes and output, called in-process through ``flows.cli.main``."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

import flows.cli
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table, write


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
