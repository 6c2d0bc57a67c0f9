"""The id checks over an external sort (a dataset above ``validation_memory_mb``) find what
the in-memory checks find and say it in the same words, whatever the order of files and row
groups, and leave no spill files behind, also when they refuse."""

from __future__ import annotations

import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipeline.writes.external_sort as external_sort
from pipeline.contract.id_findings import VALIDATION_MEMORY_MB
from pipeline.contract.schema import DEFAULT_MODULE_ID, DatasetError
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table

BOUNDED_MB = 2**-20
"""A one-byte budget: a run per row group (with row groups of 3 rows and two modules, more
than ``GROUPS_PER_RUN`` runs, so the merge takes a pass of its own)."""
EPISODES = 24
STEPS = 5


def _dataset(id_type: pa.DataType, modules: int) -> pa.Table:
    """``EPISODES`` whole episodes of ``STEPS`` steps for each of ``modules`` modules."""
    one = episode_table(EPISODES * STEPS, episode_length=STEPS, tasks=("a", "b", "c"))
    one = one.set_column(0, "eps_id", one.column("eps_id").cast(id_type))
    if modules == 1:
        return one
    return pa.concat_tables(
        one.append_column("module_id", pa.array([f"m{m}"] * one.num_rows)) for m in range(modules)
    )


def _scatter(directory, table: pa.Table, seed: int, group_rows: int = 3) -> None:
    """``table``'s rows shuffled into three files of row groups of ``group_rows`` rows."""
    shuffled = table.take(np.random.default_rng(seed).permutation(table.num_rows))
    bounds = np.linspace(0, table.num_rows, 4).astype(int)
    directory.mkdir(parents=True, exist_ok=True)
    for part in range(3):
        piece = shuffled.slice(bounds[part], bounds[part + 1] - bounds[part])
        pq.write_table(piece, directory / f"part-{part}.parquet", row_group_size=group_rows)


def _outcome(directory, memory_mb: float, **kwargs) -> object:
    """The summary of an accepted dataset, or the refusal's message."""
    try:
        info = inspect_episodes(directory, validation_memory_mb=memory_mb, **kwargs)
    except DatasetError as exc:
        return str(exc)
    return (info.num_rows, info.num_episodes, info.task_ids, info.module_ids)


@pytest.mark.parametrize("modules", [1, 2])
@pytest.mark.parametrize("id_type", [pa.int64(), pa.string()])
def test_episodes_across_files_and_row_groups_in_any_order(tmp_path, id_type, modules):
    _scatter(tmp_path, _dataset(id_type, modules), seed=1)

    summary = (EPISODES * STEPS * modules, EPISODES, ("a", "b", "c"))
    modules_ids = tuple(f"m{m}" for m in range(modules)) if modules > 1 else (DEFAULT_MODULE_ID,)
    assert _outcome(tmp_path, BOUNDED_MB) == (*summary, modules_ids)
    assert _outcome(tmp_path, VALIDATION_MEMORY_MB) == (*summary, modules_ids)


def _broken(table: pa.Table, fault: str, rng: np.random.Generator) -> pa.Table:
    """``table`` with one kind of fault at a few random rows."""
    rows = np.sort(rng.choice(table.num_rows, 3, replace=False))
    if fault == "repeat":
        return pa.concat_tables([table, table.take(rows)])
    if fault == "gap":
        keep = np.ones(table.num_rows, bool)
        keep[rows] = False
        return table.filter(pa.array(keep))
    if fault == "late start":
        t = table.column("t").to_numpy().copy()
        episode = table.column("eps_id").to_numpy(zero_copy_only=False)
        t[episode == (3 if pa.types.is_integer(table.schema.field("eps_id").type) else "3")] += 1
        return table.set_column(table.schema.get_field_index("t"), "t", pa.array(t, pa.int32()))
    if fault in ("terminateds", "truncateds"):
        flag = table.column(fault).to_numpy(zero_copy_only=False).copy()
        flag[rows] = True
        return table.set_column(table.schema.get_field_index(fault), fault, pa.array(flag))
    tasks = table.column("task_id").to_pylist()
    for row in rows:
        tasks[row] = "z"
    index = table.schema.get_field_index("task_id")
    return table.set_column(index, "task_id", pa.array(tasks).dictionary_encode())


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(
    "fault", ["repeat", "gap", "late start", "terminateds", "truncateds", "task change"]
)
@pytest.mark.parametrize(("id_type", "modules"), [(pa.int64(), 1), (pa.string(), 2)])
def test_a_fault_is_refused_in_the_same_words(tmp_path, fault, seed, id_type, modules):
    rng = np.random.default_rng(seed)
    _scatter(tmp_path, _broken(_dataset(id_type, modules), fault, rng), seed, group_rows=10)

    refused = _outcome(tmp_path, VALIDATION_MEMORY_MB)

    assert isinstance(refused, str)
    assert _outcome(tmp_path, BOUNDED_MB) == refused
    partial = _outcome(tmp_path, VALIDATION_MEMORY_MB, allow_partial_episodes=True)
    assert _outcome(tmp_path, BOUNDED_MB, allow_partial_episodes=True) == partial


@pytest.fixture
def spills(tmp_path, monkeypatch) -> list:
    """Where the sort spills: temporary directories go under ``tmp_path/tmp``, and the run
    files written are recorded."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    written = []
    spill = external_sort._spill

    def recorded(batches, schema, keys, path, index, group_rows):
        written.append(path)
        return spill(batches, schema, keys, path, index, group_rows)

    monkeypatch.setattr(external_sort, "_spill", recorded)
    return written


@pytest.mark.parametrize("fault", [None, "repeat"])
def test_no_spill_file_is_left_behind(tmp_path, spills, fault):
    table = _dataset(pa.string(), 2)
    if fault is not None:
        table = _broken(table, fault, np.random.default_rng(0))
    _scatter(tmp_path / "data", table, seed=0)

    outcome = _outcome(tmp_path / "data", BOUNDED_MB)

    assert isinstance(outcome, str) == (fault is not None)
    assert len(spills) > external_sort.GROUPS_PER_RUN
    assert all(path.is_relative_to(tmp_path / "tmp") for path in spills)
    assert list((tmp_path / "tmp").iterdir()) == []


def test_rows_already_in_order_are_checked_without_spilling(tmp_path, spills):
    """Int64 ids written episode after episode (as writers do) need no sort, even when an
    episode goes on in the next file."""
    table = _dataset(pa.int64(), 2).sort_by([("eps_id", "ascending"), ("module_id", "ascending")])
    for part, start in enumerate(range(0, table.num_rows, 70)):
        pq.write_table(table.slice(start, 70), tmp_path / f"part-{part}.parquet", row_group_size=9)
    gap = table.filter(pa.array(np.arange(table.num_rows) != 102))
    pq.write_table(gap, tmp_path / "gap.parquet", row_group_size=9)
    (tmp_path / "in-order").mkdir()
    for part in range(4):
        (tmp_path / f"part-{part}.parquet").rename(tmp_path / "in-order" / f"part-{part}.parquet")
    (tmp_path / "with-gap").mkdir()
    (tmp_path / "gap.parquet").rename(tmp_path / "with-gap" / "gap.parquet")

    summary = (EPISODES * STEPS * 2, EPISODES, ("a", "b", "c"), ("m0", "m1"))
    assert _outcome(tmp_path / "in-order", BOUNDED_MB) == summary
    refused = _outcome(tmp_path / "with-gap", VALIDATION_MEMORY_MB)
    assert _outcome(tmp_path / "with-gap", BOUNDED_MB) == refused
    assert " jumps from t " in refused
    assert spills == []
