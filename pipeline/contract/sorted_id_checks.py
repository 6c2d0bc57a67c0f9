"""The id checks in memory bounded independently of the row count: one pass over the rows
in ``(eps_id, module, t)`` order, as the files hold them or after an external sort.

``pipeline.contract.id_checks`` holds every row's ids at once (about 80 bytes a row) and
hands a dataset over here when that would not fit its budget. Here the id columns are read
one row group at a time into narrow tables (``key``, ``module``, ``t``, ``pos``: the row's
place in file order, the flags, ``task``: about 34 bytes a row) and scanned
(``pipeline.contract.id_scan``), keeping only the last row and the first finding of each
kind. Rows are first scanned as they are read: int64 ids written episode after episode, as
writers and ``compact`` produce them, pass in one read. At the first row that comes before
the one read just before it (or for string ids) the scan is dropped, and the rows are read
again and sorted by ``pipeline.writes.external_sort`` in runs of a sixteenth of the budget,
spilled to a temporary directory that is always removed; memory stays near the budget
whatever the row count.

The order is the in-memory checks' order, so both report the same first findings in the
same words: int64 ``eps_id`` values are their own key; string ids sort by the position of
their first row (the in-memory checks code strings in order of first appearance), which
takes a first sort by the string (ties in file order, so each id's first row leads its
group). Module and task codes are assigned as they first appear, the way the in-memory
checks unify each file's dictionary; there are few of them, so they stay in memory.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.footer_checks import read_row_groups
from pipeline.contract.id_findings import FLAGS, EpisodeIds, id_columns
from pipeline.contract.id_scan import Scan
from pipeline.contract.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, EpisodeSchema
from pipeline.io.arrow_columns import decoded
from pipeline.io.dataset_source import ResolvedSource
from pipeline.writes.external_sort import sort_tables

_SCRATCH_PREFIX = "offmeta-id-checks-"
_SORTS_HELD = 16
"""Run bytes are the budget over this: a sort holds about twice its run bytes, string ids
hold one sort's merge while the next gathers a run, and the allocator keeps freed run
buffers for the next run. Measured on 8M rows of string ids with a task column and a budget
of 200 MB, peak RSS above the interpreter's 84 MB: 294 MB with runs of a quarter of the
budget (Arrow holding 127 MB at most), 185 MB with an eighth, 119 MB with a sixteenth
(``bench/validation_memory.py validate``)."""


def check_sorted_episodes(
    resolved: ResolvedSource,
    schema: EpisodeSchema,
    *,
    allow_partial_episodes: bool,
    memory_bytes: int,
) -> EpisodeIds:
    """``check_episodes`` in about ``memory_bytes`` of memory plus one row group's id
    columns. Rows already in order (int64 ids, as writers produce them) are checked as they
    are read; otherwise sorted runs are spilled to a temporary directory that is removed on
    return and on error."""
    ids = _Ids(resolved, schema)
    scan = _scan_in_file_order(ids)
    if scan is None:
        ids = _Ids(resolved, schema)
        scan = _new_scan(ids)
        run_bytes = max(1, memory_bytes // _SORTS_HELD)
        with tempfile.TemporaryDirectory(prefix=_SCRATCH_PREFIX) as scratch:
            ordered = _episode_order(ids, run_bytes, Path(scratch))
            with contextlib.closing(ordered):
                for table in ordered:
                    scan.feed(table)
    scan.refuse(
        resolved.description,
        allow_partial_episodes=allow_partial_episodes,
        several_modules=len(ids.modules.used) > 1,
    )
    return EpisodeIds(scan.eps_ids, ids.task_ids(scan.tasks_at_starts), ids.module_ids())


def _new_scan(ids: _Ids) -> Scan:
    return Scan(
        files=ids.resolved.files,
        file_starts=ids.file_starts,
        module_names=ids.modules.names if ids.schema.has_module_id else None,
        task_names=ids.tasks.names if ids.schema.has_task_id else None,
    )


def _scan_in_file_order(ids: _Ids) -> Scan | None:
    """The checks over the rows as the files hold them; None as soon as a row comes before
    the one read just before it, or for string ids (ordered by first appearance, which only
    a sort can confirm)."""
    scan = _new_scan(ids)
    tables = ids.tables()
    with contextlib.closing(tables):
        for table in tables:
            if "eps" in table.column_names:
                return None
            scan.feed(table)
            if not scan.in_order:
                return None
    return scan


class _Codes:
    """Codes of a few distinct strings (modules, tasks) in order of first appearance in
    the files' dictionaries, as ``unify_dictionaries`` gives them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self._code: dict[str, int] = {}
        self.used: set[int] = set()

    def encode(self, column: pa.ChunkedArray) -> np.ndarray:
        parts = []
        for chunk in column.chunks:
            if not pa.types.is_dictionary(chunk.type):
                chunk = pc.dictionary_encode(chunk)
            mapping = np.array([self._add(v) for v in chunk.dictionary.to_pylist()], np.int32)
            codes = mapping[chunk.indices.to_numpy(zero_copy_only=False)]
            self.used.update(np.unique(codes).tolist())
            parts.append(codes)
        return np.concatenate(parts) if parts else np.zeros(0, np.int32)

    def used_names(self, codes: set[int] | None = None) -> tuple[str, ...]:
        return tuple(sorted(self.names[c] for c in (self.used if codes is None else codes)))

    def _add(self, value: str) -> int:
        if value not in self._code:
            self._code[value] = len(self.names)
            self.names.append(value)
        return self._code[value]


class _Ids:
    """Reads the id columns row group by row group as narrow tables ready to sort."""

    def __init__(self, resolved: ResolvedSource, schema: EpisodeSchema) -> None:
        self.resolved, self.schema = resolved, schema
        self.modules, self.tasks = _Codes(), _Codes()
        self.file_starts: list[int] = []
        """Position (in file order) of each file's first row."""
        self.string_ids = False

    def tables(self) -> Iterator[pa.Table]:
        canonical, on_disk = id_columns(self.schema)
        position = 0
        for path in self.resolved.files:
            self.file_starts.append(position)
            for group in read_row_groups(self.resolved, path, on_disk):
                table = group.rename_columns(canonical)
                yield self._narrow(table, position)
                position += table.num_rows

    def _narrow(self, table: pa.Table, position: int) -> pa.Table:
        columns: dict[str, pa.Array | np.ndarray | pa.ChunkedArray] = {}
        episodes = table.column("eps_id")
        if pa.types.is_integer(episodes.type):
            columns["key"] = pc.cast(episodes, pa.int64())
        else:
            self.string_ids = True
            columns["eps"] = pc.cast(decoded(episodes), pa.large_string())
        if self.schema.has_module_id:
            columns["module"] = self.modules.encode(table.column("module_id"))
        columns["t"] = pc.cast(table.column("t"), pa.int64())
        columns["pos"] = np.arange(position, position + table.num_rows, dtype=np.int64)
        for flag in FLAGS:
            columns[flag] = table.column(flag)
        if self.schema.has_task_id:
            columns["task"] = self.tasks.encode(table.column("task_id"))
        return pa.table(columns)

    def task_ids(self, codes: set[int]) -> tuple[str, ...]:
        """Tasks at these codes, sorted; the default task without a ``task_id`` column."""
        if not self.schema.has_task_id:
            return (DEFAULT_TASK_ID,)
        return self.tasks.used_names(codes)

    def module_ids(self) -> tuple[str, ...]:
        if not self.schema.has_module_id:
            return (DEFAULT_MODULE_ID,)
        return self.modules.used_names()


def _episode_order(ids: _Ids, run_bytes: int, scratch: Path) -> Iterator[pa.Table]:
    """Every row in ``(key, module, t)`` order, ties in file order."""
    keys = ["key", "module", "t"] if ids.schema.has_module_id else ["key", "t"]
    tables = _keyed(ids, run_bytes, scratch)
    (scratch / "episodes").mkdir()
    yield from sort_tables(tables, keys, run_bytes=run_bytes, scratch=scratch / "episodes")


def _keyed(ids: _Ids, run_bytes: int, scratch: Path) -> Iterator[pa.Table]:
    """The narrow tables with an int64 ``key``: int64 ids as they are; a string id gets the
    position of its first row, by a first sort on the string."""
    tables = ids.tables()
    first = next(tables, None)
    if first is None:
        return
    if not ids.string_ids:
        yield first
        yield from tables
        return
    (scratch / "eps_ids").mkdir()
    by_string = sort_tables(
        _chained(first, tables), ["eps"], run_bytes=run_bytes, scratch=scratch / "eps_ids"
    )
    yield from _first_positions(by_string)


def _chained(first: pa.Table, rest: Iterator[pa.Table]) -> Iterator[pa.Table]:
    yield first
    yield from rest


def _first_positions(tables: Iterator[pa.Table]) -> Iterator[pa.Table]:
    """Rows sorted by ``eps`` (ties in file order) with ``key``: the position of the first
    row of their ``eps``. The last id of a table may go on in the next, so its rows wait."""
    held: pa.Table | None = None
    for table in tables:
        if held is not None:
            table = pa.concat_tables([held, table])
        if table.num_rows == 0:
            continue
        starts = _group_starts(table.column("eps"))
        last = int(starts[-1])
        if last:
            yield _with_keys(table.slice(0, last), starts[:-1])
        held = table.slice(last)
    if held is not None and held.num_rows:
        yield _with_keys(held, np.zeros(1, np.int64))


def _group_starts(eps: pa.ChunkedArray) -> np.ndarray:
    rows = len(eps)
    differs = pc.not_equal(eps.slice(1), eps.slice(0, rows - 1))
    changed = differs.to_numpy(zero_copy_only=False) if rows > 1 else np.zeros(0, bool)
    return np.concatenate(([0], np.flatnonzero(changed) + 1)).astype(np.int64)


def _with_keys(table: pa.Table, starts: np.ndarray) -> pa.Table:
    """``table`` whose groups begin at ``starts``, each row keyed by its group's first
    position."""
    positions = table.column("pos").to_numpy()
    lengths = np.diff(np.append(starts, table.num_rows))
    return table.append_column("key", pa.array(np.repeat(positions[starts], lengths)))
