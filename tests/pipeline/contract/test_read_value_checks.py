"""When validation skipped the value scan (``check_values`` ``sample`` or ``off``), the reads
that feed training refuse NaN, inf and discrete actions outside the declared space with the
message a full validation gives; after
``full`` they trust it and check nothing again."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes, read_episodes
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.options import TaskStream
from pipeline.tasks.samples import read_task_samples, task_samples
from tests.helpers.episode_files import episode_table, tensor

ROWS = 12
BAD_ROW = 7
"""In row group 3 of 6: ``sample`` scans row group 0 only, so validation passes."""


def _dataset(directory, column: str | None) -> str:
    """Two files of ``ROWS`` rows in row groups of 2; the second has NaN in ``column``'s
    ``BAD_ROW`` (``None``: every value finite). Returns the second file's path."""
    directory.mkdir(exist_ok=True)
    for part in range(2):
        table = episode_table(ROWS, first_episode=4 * part, seed=part, tasks=("ab"[part],))
        if part == 1 and column is not None:
            chunk = table.column(column).combine_chunks()
            values = chunk.to_numpy() if column == "rewards" else chunk.to_numpy_ndarray()
            values = values.copy()
            values[BAD_ROW] = np.nan
            array = pa.array(values) if column == "rewards" else tensor(values)
            table = table.set_column(table.schema.get_field_index(column), column, array)
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=2)
    return str(directory / "part-1.parquet")


def _validation_message(directory) -> str:
    with pytest.raises(DatasetError) as refused:
        inspect_episodes(directory, check_values="full")
    return str(refused.value)


def _streamed(info) -> None:
    windows = task_samples(info, support=1, query=1, mode="stream", memory_budget_mb=64)
    for index in range(len(windows.windows)):
        windows.read_window(index)


def _task_reads_refuse(info, expected: str) -> None:
    """Task samples read in memory and streamed window by window both refuse with
    ``expected``."""
    with pytest.raises(DatasetError) as in_memory:
        read_task_samples(info, support=1, query=1)
    assert str(in_memory.value) == expected
    with pytest.raises(DatasetError) as in_windows:
        _streamed(info)
    assert str(in_windows.value) == expected


@pytest.mark.parametrize("check", ["sample", "off"])
@pytest.mark.parametrize("column", ["rewards", "obs", "actions"])
def test_task_reads_refuse_what_validation_skipped_with_its_message(tmp_path, column, check):
    path = _dataset(tmp_path, column)
    info = inspect_episodes(tmp_path, check_values=check)
    expected = _validation_message(tmp_path)
    assert expected == (
        f"{path}: column {column!r} has non-finite values (NaN or inf) in 1 of {ROWS} rows, "
        "first at eps_id 6 t 1; expected finite numbers in every row. Fix: drop the episodes "
        "holding them or repair the values where they were recorded"
    )
    _task_reads_refuse(info, expected)


def test_a_column_not_read_is_not_refused(tmp_path):
    _dataset(tmp_path, "rewards")
    info = inspect_episodes(tmp_path, check_values="off")
    samples = read_task_samples(info, support=1, query=1, columns=["obs", "actions"])
    assert samples.columns == ("obs", "actions")


def test_after_a_full_validation_reads_do_not_scan_again(tmp_path):
    """A NaN written after a full validation (same rows, so the plan still holds) reaches the
    samples: the reads trusted the scan. After ``sample`` the same file is refused."""
    _dataset(tmp_path, None)
    full, sample = (inspect_episodes(tmp_path, check_values=c) for c in ("full", "sample"))
    path = _dataset(tmp_path, "rewards")

    samples = read_task_samples(full, support=1, query=1, columns=["rewards"])
    assert np.isnan(samples.arrays["rewards"]).sum() == 1
    windows = task_samples(full, support=1, query=1, mode="stream", memory_budget_mb=64)
    held = [windows.read_window(i).arrays["rewards"] for i in range(len(windows.windows))]
    assert np.isnan(np.concatenate(held)).sum() == 1
    with pytest.raises(DatasetError) as refused:
        read_task_samples(sample, support=1, query=1, columns=["rewards"])
    assert str(refused.value).startswith(f"{path}: column 'rewards' has non-finite values")


@pytest.mark.timeout(120)
def test_row_streams_refuse_what_validation_skipped_with_its_message(tmp_path, ray_session):
    _dataset(tmp_path, "obs")
    expected = _validation_message(tmp_path)
    episodes = read_episodes(tmp_path, check_values="sample")

    for materialize in (False, True):
        rows = RowStream(episodes, materialize=materialize, cache_budget_mb=0)
        with pytest.raises(DatasetError) as in_rows:
            # Materialized, the blocks are checked as the stream is built; read from the
            # files, as the read tasks give them.
            [stream] = split_for_learners(rows, 1, minibatch_size=4)
            with stream:
                list(stream.take(2 * ROWS))
        assert str(in_rows.value) == expected


def _discrete_dataset(directory, bad: int) -> None:
    """Two files of discrete actions, the second with ``bad`` in row ``BAD_ROW``."""
    tasks = ("a", "b")
    for part in range(2):
        actions = np.zeros(ROWS, dtype=np.int64)
        if part == 1:
            actions[BAD_ROW] = bad
        table = episode_table(
            ROWS,
            action_dim=None,
            first_episode=4 * part,
            tasks=(tasks[part],),
            actions=pa.array(actions),
        )
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=2)


@pytest.mark.parametrize("check", ["sample", "off"])
def test_task_reads_refuse_discrete_actions_outside_the_space_with_its_message(tmp_path, check):
    _discrete_dataset(tmp_path, 5)
    (tmp_path / "dataset.json").write_text(
        json.dumps({"id": "tiny", "action_space": {"kind": "discrete", "n": 2}})
    )
    info = inspect_episodes(tmp_path, check_values=check)
    expected = _validation_message(tmp_path)
    assert expected == (
        f"{tmp_path / 'part-1.parquet'}: column 'actions' has actions outside [0, 2) in 1 of "
        f"{ROWS} rows, first at eps_id 6 t 1 (action 5); expected 0 <= action < 2 as the "
        f"discrete action_space (n: 2) in {tmp_path / 'dataset.json'} declares. Fix: correct "
        "the actions or action_space.n"
    )
    _task_reads_refuse(info, expected)


@pytest.mark.parametrize("check", ["sample", "off"])
def test_task_reads_refuse_negative_discrete_actions_without_a_space(tmp_path, check):
    _discrete_dataset(tmp_path, -1)
    info = inspect_episodes(tmp_path, check_values=check)
    expected = _validation_message(tmp_path)
    assert expected == (
        f"{tmp_path / 'part-1.parquet'}: column 'actions' has negative actions in 1 of {ROWS} "
        "rows, first at eps_id 6 t 1 (action -1); expected discrete actions to be indices >= 0 "
        f"(int64 actions are discrete; no action_space in {tmp_path / 'dataset.json'}). Fix: "
        "correct the actions, or store continuous ones as float32 tensors"
    )
    _task_reads_refuse(info, expected)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["memory", "stream"])
@pytest.mark.parametrize("bad", ["rewards", "actions"])
def test_a_ray_train_worker_shard_refuses_what_validation_skipped(tmp_path, mode, bad):
    """What a Ray Train worker does with its share (``flows.scale_out.worker``): the
    dataset's description arrives pickled, the worker reads the task samples itself and
    streams only its own rank's meta-batches; the reads refuse as validation would."""
    if bad == "rewards":
        _dataset(tmp_path, "rewards")
    else:
        _discrete_dataset(tmp_path, -1)
    expected = _validation_message(tmp_path)
    shipped = pickle.loads(pickle.dumps(inspect_episodes(tmp_path, check_values="off")))
    budget = 64 if mode == "stream" else None
    with pytest.raises(DatasetError) as refused:
        # In memory the worker's read refuses; streamed, its first window read does.
        samples = read_task_samples(shipped, support=1, query=1, mode=mode, memory_budget_mb=budget)
        (stream,) = split_for_learners(TaskStream(samples, ranks=[1]), 2, minibatch_size=1)
        with stream:
            list(stream.take(4 * ROWS))
    assert str(refused.value) == expected
