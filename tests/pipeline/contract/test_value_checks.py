"""Values a learner cannot use are refused: NaN or inf in the float columns, discrete actions
outside the declared action space; float actions outside a declared box draw a warning.
Messages name the file, the column, how many rows and the first one."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract.schema import DatasetError
from pipeline.contract.value_checks import SAMPLE_EVERY
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table, tensor, write, write_two_agents

_NON_FINITE = (
    "; expected finite numbers in every row. Fix: drop the episodes holding them or repair the "
    "values where they were recorded"
)


def _refused(source, **kwargs) -> str:
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(source, **kwargs)
    return str(caught.value)


def _action_space(directory, **space) -> None:
    (directory / "dataset.json").write_text(json.dumps({"id": "tiny", "action_space": space}))


def _with_bad_rows(column: str, bad: float) -> pa.Array:
    """``column`` of a 6-row table with ``bad`` in rows 4 (every component) and 5 (one)."""
    width = {"obs": 3, "new_obs": 3, "actions": 2, "rewards": 1}[column]
    values = np.random.default_rng(1).normal(size=(6, width)).astype(np.float32)
    values[4, :] = bad
    values[5, -1] = bad
    return pa.array(values[:, 0]) if column == "rewards" else tensor(values)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("column", ["obs", "new_obs", "actions", "rewards"])
def test_non_finite_values_are_refused_by_column(tmp_path, column, bad):
    columns = {"new_obs": tensor(np.zeros((6, 3))), column: _with_bad_rows(column, bad)}
    table = episode_table(**columns)
    path = write(tmp_path / "part.parquet", table)
    assert _refused(path) == (
        f"{path}: column {column!r} has non-finite values (NaN or inf) in 2 of 6 rows, first "
        f"at eps_id 1 t 1{_NON_FINITE}"
    )


def test_the_message_names_the_file_the_column_on_disk_and_string_episodes(tmp_path):
    first = episode_table(eps_id=pa.array(["e0"] * 3 + ["e1"] * 3))
    second = episode_table(
        eps_id=pa.array(["e2"] * 3 + ["e17"] * 3), rewards=_with_bad_rows("rewards", np.nan)
    )
    write(tmp_path / "part-00000.parquet", first.rename_columns(_renamed(first)))
    path = write(tmp_path / "part-00003.parquet", second.rename_columns(_renamed(second)))
    assert _refused(tmp_path, column_map={"rewards": "reward"}) == (
        f"{path}: column 'rewards' (on disk 'reward') has non-finite values (NaN or inf) in 2 "
        f"of 6 rows, first at eps_id 'e17' t 1{_NON_FINITE}"
    )


def _renamed(table: pa.Table) -> list[str]:
    return ["reward" if name == "rewards" else name for name in table.column_names]


def test_several_modules_name_the_module(tmp_path):
    path = write_two_agents(tmp_path, [0, 10]) / "part-0.parquet"
    table = pq.read_table(path)
    rewards = table.column("rewards").to_numpy().copy()
    rewards[3] = np.nan
    index = table.schema.get_field_index("rewards")
    pq.write_table(table.set_column(index, "rewards", pa.array(rewards)), path)
    assert _refused(tmp_path) == (
        f"{path}: column 'rewards' has non-finite values (NaN or inf) in 1 of 10 rows, first "
        f"at module_id 'm1' eps_id 0 t 1{_NON_FINITE}"
    )


def test_discrete_actions_outside_the_declared_space_are_refused(tmp_path):
    actions = pa.array([0, 1, 0, 7, 1, -1], pa.int64())
    path = write(tmp_path / "part.parquet", episode_table(action_dim=None, actions=actions))
    _action_space(tmp_path, kind="discrete", n=2)
    assert _refused(tmp_path) == (
        f"{path}: column 'actions' has actions outside [0, 2) in 2 of 6 rows, first at eps_id 1 "
        f"t 0 (action 7); expected 0 <= action < 2 as the discrete action_space (n: 2) in "
        f"{tmp_path / 'dataset.json'} declares. Fix: correct the actions or action_space.n"
    )
    _action_space(tmp_path, kind="discrete", n=8)
    assert _refused(tmp_path).startswith(
        f"{path}: column 'actions' has actions outside [0, 8) in 1 of 6 rows, first at eps_id 1 "
        "t 2 (action -1);"
    )


@pytest.mark.parametrize("metadata", [False, True], ids=["no-dataset-json", "no-action-space"])
def test_negative_discrete_actions_are_refused_without_a_declared_space(tmp_path, metadata):
    """A discrete action is an index: -1 would silently pick the last logit."""
    actions = pa.array([0, 1, 0, 7, -1, -3], pa.int64())
    path = write(tmp_path / "part.parquet", episode_table(action_dim=None, actions=actions))
    if metadata:
        (tmp_path / "dataset.json").write_text(json.dumps({"id": "tiny"}))
    assert _refused(tmp_path) == (
        f"{path}: column 'actions' has negative actions in 2 of 6 rows, first at eps_id 1 t 1 "
        "(action -1); expected discrete actions to be indices >= 0 (int64 actions are "
        f"discrete; no action_space in {tmp_path / 'dataset.json'}). Fix: correct the "
        "actions, or store continuous ones as float32 tensors"
    )
    write(path, episode_table(action_dim=None, actions=pa.array([0, 1, 0, 7, 1, 3], pa.int64())))
    assert inspect_episodes(tmp_path).values.rows == 6


@pytest.mark.parametrize("actions", [[0, 1, 0, 1, 1, 0], [0, 1, 0, 7, 1, -1]])
def test_footer_statistics_and_the_scan_agree(tmp_path, actions):
    table = episode_table(action_dim=None, actions=pa.array(actions, pa.int64()))
    outcomes = []
    for statistics in (True, False):
        directory = tmp_path / f"statistics-{statistics}"
        path = directory / "part.parquet"
        directory.mkdir()
        pq.write_table(table, path, row_group_size=2, write_statistics=statistics)
        _action_space(directory, kind="discrete", n=2)
        try:
            outcomes.append(inspect_episodes(directory).values.rows)
        except DatasetError as refused:
            outcomes.append(str(refused).replace(str(directory), "DIR"))
    assert outcomes[0] == outcomes[1]


def test_statistics_clear_discrete_actions_without_reading_them(tmp_path):
    """A broken ``actions`` page behind statistics in [0, n) is never read."""
    table = episode_table(action_dim=None, actions=pa.array([0, 1, 0, 1, 1, 0], pa.int64()))
    path = write(tmp_path / "part.parquet", table)
    _break_column(path, "actions")
    _action_space(tmp_path, kind="discrete", n=2)
    assert inspect_episodes(tmp_path).values.rows == 6
    _action_space(tmp_path, kind="discrete", n=1)  # statistics say 1: the page is read
    assert _refused(tmp_path).startswith(f"{path}: columns obs, actions, rewards cannot be read")


def test_float_statistics_never_clear_a_column(tmp_path):
    """pyarrow leaves NaN out of a float column's min/max: they look finite, and the column
    is scanned anyway."""
    table = episode_table(rewards=_with_bad_rows("rewards", np.nan))
    path = write(tmp_path / "part.parquet", table)
    stats = pq.ParquetFile(path).metadata.row_group(0).column(4).statistics
    assert stats.has_min_max and np.isfinite([stats.min, stats.max]).all()
    assert "column 'rewards' has non-finite values" in _refused(path)


def test_a_broken_value_page_is_refused_by_name(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table())
    _break_column(path, "rewards")
    refused = _refused(path)
    assert refused.startswith(f"{path}: columns obs, actions, rewards cannot be read (")
    assert refused.endswith(
        "); expected readable Parquet data behind a valid footer (is the file corrupted?)"
    )


def _break_column(path, column: str) -> None:
    metadata = pq.ParquetFile(path).metadata
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(names.index(column))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    broken = bytearray(path.read_bytes())
    broken[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(broken))


def test_float_actions_outside_a_box_are_a_warning(tmp_path):
    actions = np.zeros((6, 2), np.float32)
    actions[2] = [1.5, 0.0]
    actions[4] = [-2.0, 3.0]
    actions[5] = [1.0, -1.0]  # on the bounds: inside
    path = write(tmp_path / "part.parquet", episode_table(actions=tensor(actions)))
    _action_space(tmp_path, kind="box", shape=[2], low=-1, high=1)
    info = inspect_episodes(tmp_path)
    warning = (
        f"column 'actions' has components outside action_space's bounds [-1.0, 1.0] "
        f"({tmp_path / 'dataset.json'}) in 2 of 6 rows, first in {path} at eps_id 0 t 2; kept "
        "as recorded (recorders often store actions before the environment clips them)"
    )
    assert (info.values.actions_outside_box, info.values.warning) == (2, warning)
    assert info.summary()["actions_outside_box"] == 2

    _action_space(tmp_path, kind="box", shape=[2], high=1.5)
    info = inspect_episodes(tmp_path)
    assert info.values.actions_outside_box == 1
    assert "bounds [-inf, 1.5]" in str(info.values.warning)
    _action_space(tmp_path, kind="box", shape=[2], low=-5, high=5)
    info = inspect_episodes(tmp_path)
    assert (info.values.actions_outside_box, info.values.warning) == (0, None)
    assert "actions_outside_box" not in info.summary()


def _row_groups_with_nan(tmp_path, group: int):
    """``2 * SAMPLE_EVERY`` row groups of 2 rows, a NaN reward in row group ``group``."""
    rows = 4 * SAMPLE_EVERY
    rewards = np.zeros(rows, np.float32)
    rewards[2 * group + 1] = np.nan
    table = episode_table(rows, episode_length=4, rewards=pa.array(rewards))
    path = tmp_path / f"nan-in-{group}" / "part.parquet"
    path.parent.mkdir()
    pq.write_table(table, path, row_group_size=2)
    return path


def test_sample_checks_one_row_group_in_sample_every(tmp_path):
    rows = 4 * SAMPLE_EVERY
    unsampled = _row_groups_with_nan(tmp_path, 1)
    assert _refused(unsampled).startswith(
        f"{unsampled}: column 'rewards' has non-finite values (NaN or inf) in 1 of {rows} rows"
    )
    assert inspect_episodes(unsampled, check_values="sample").values.rows == 4

    sampled = _row_groups_with_nan(tmp_path, SAMPLE_EVERY)
    t = (2 * SAMPLE_EVERY + 1) % 4
    assert _refused(sampled, check_values="sample") == (
        f"{sampled}: column 'rewards' has non-finite values (NaN or inf) in 1 of the 4 rows "
        f"sampled of {rows}, first at eps_id {SAMPLE_EVERY // 2} t {t}{_NON_FINITE}"
    )


def test_off_checks_no_values(tmp_path):
    table = episode_table(rewards=_with_bad_rows("rewards", np.inf))
    path = write(tmp_path / "part.parquet", table)
    info = inspect_episodes(path, check_values="off")
    assert (info.num_rows, info.values.check_values, info.values.rows) == (6, "off", 0)
