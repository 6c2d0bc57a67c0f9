"""Sort rows by (task_id, eps_id, t) and drop repeated steps, in bounded memory.

An external merge sort: ``add`` sorts each chunk it is given, drops exact repeats of a
step, and spills it to a temporary Parquet run; ``merged`` merges the runs (at most
``fan_in`` at a time, in several passes when there are more) and yields sorted tables. A
merge step reads one batch from each run, takes every row up to the smallest of the
batches' last keys (no run can hold a smaller key later), sorts those rows and yields
them, so memory is ``fan_in`` batches whatever the number of rows.

A step recorded twice must be an exact copy: two rows with the same key that differ in
any column are handed to ``on_conflict``, which raises.
"""

from __future__ import annotations

import bisect
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.importers.columns import first_difference

SORT_KEYS = ("task_id", "eps_id", "t")
ORIGIN = "_origin"
"""Bookkeeping column: where a row was read (the importer's file index); sorts repeats of
one step in reading order and names the files in conflict messages. Never compared."""
FAN_IN = 64
MERGE_BYTES = 256 << 20

Conflict = Callable[[pa.Table, int, int, str], NoReturn]
"""``on_conflict(table, first_row, second_row, column)``: raise for two rows of ``table``
with the same key and a different value in ``column``."""


class ExternalSorter:
    """Sorted runs on disk, merged on demand (see module doc)."""

    def __init__(self, directory: Path, on_conflict: Conflict, *, fan_in: int = FAN_IN) -> None:
        self._root = Path(tempfile.mkdtemp(prefix=".offmeta-sort-", dir=directory))
        self._on_conflict = on_conflict
        self._fan_in = fan_in
        self._runs: list[Path] = []
        self._row_bytes = 1
        self.duplicate_rows = 0
        self.schemas: list[pa.Schema] = []

    def __enter__(self) -> ExternalSorter:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        shutil.rmtree(self._root, ignore_errors=True)

    def add(self, table: pa.Table) -> None:
        """Sort one chunk (with an ``ORIGIN`` column), drop its repeats, spill it."""
        if table.num_rows == 0:
            return
        table = self._sort_unique(table)
        self._row_bytes = max(self._row_bytes, table.nbytes // table.num_rows)
        path = self._root / f"run-{len(self._runs):06d}.arrow"
        with pa.ipc.new_file(path, table.schema) as writer:
            writer.write_table(table, max_chunksize=self._batch_rows())
        self._runs.append(path)
        self.schemas.append(table.schema)

    def merged(self, schema: pa.Schema) -> Iterator[pa.Table]:
        """Every row added, sorted by ``SORT_KEYS``, repeats dropped, as tables of
        ``schema`` (columns missing from a run are filled with nulls)."""
        runs = list(self._runs)
        while len(runs) > self._fan_in:
            groups = [runs[i : i + self._fan_in] for i in range(0, len(runs), self._fan_in)]
            runs = [self._merge_to_run(group, schema) for group in groups]
        yield from self._merge(runs, schema)

    def _merge_to_run(self, runs: list[Path], schema: pa.Schema) -> Path:
        path = self._root / f"merged-{runs[0].stem}-{len(runs)}.arrow"
        with pa.ipc.new_file(path, schema) as writer:
            for table in self._merge(runs, schema):
                writer.write_table(table, max_chunksize=self._batch_rows())
        for run in runs:
            run.unlink()
        return path

    def _merge(self, runs: list[Path], schema: pa.Schema) -> Iterator[pa.Table]:
        cursors = [_RunCursor(path, schema) for path in runs]
        active = [c for c in cursors if c.advance()]
        while active:
            boundary = min(c.last_key() for c in active)
            parts = [c.take_through(boundary) for c in active]
            yield self._sort_unique(pa.concat_tables(parts))
            active = [c for c in active if c.has_rows() or c.advance()]

    def _batch_rows(self) -> int:
        return max(1024, MERGE_BYTES // self._fan_in // self._row_bytes)

    def _sort_unique(self, table: pa.Table) -> pa.Table:
        """``table`` sorted by key then origin, each step kept once (after checking that
        its repeats are exact copies)."""
        order = pc.sort_indices(table, [(k, "ascending") for k in (*SORT_KEYS, ORIGIN)])
        table = table.take(order)
        repeat = _same_key_as_previous(table)
        if not repeat.any():
            return table
        second = np.flatnonzero(repeat) + 1
        first = second - 1
        compared = table.drop_columns([ORIGIN])
        difference = first_difference(compared, first, second)
        if difference is not None:
            pair, column = difference
            self._on_conflict(table, int(first[pair]), int(second[pair]), column)
        self.duplicate_rows += len(second)
        keep = np.ones(table.num_rows, dtype=bool)
        keep[second] = False
        return table.filter(pa.array(keep))


class _RunCursor:
    """Reads one sorted run batch by batch and hands out its rows in key order."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self._file = pa.OSFile(str(path))
        self._reader = pa.ipc.open_file(self._file)
        self._next = 0
        self._schema = schema
        self._table: pa.Table | None = None

    def advance(self) -> bool:
        """Load the next batch; False (and the file closed) at the end of the run."""
        if self._next == self._reader.num_record_batches:
            self._table = None
            self._file.close()
            return False
        batch = self._reader.get_batch(self._next)
        self._next += 1
        self._table = conform(pa.Table.from_batches([batch]), self._schema)
        return True

    def has_rows(self) -> bool:
        return self._table is not None and self._table.num_rows > 0

    def last_key(self) -> tuple[Any, ...]:
        assert self._table is not None
        return _key_at(self._table, self._table.num_rows - 1)

    def take_through(self, boundary: tuple[Any, ...]) -> pa.Table:
        """Remove and return the rows whose key is at most ``boundary``."""
        table = self._table
        assert table is not None
        count = bisect.bisect_right(
            range(table.num_rows), boundary, key=lambda i: _key_at(table, i)
        )
        self._table = table.slice(count)
        return table.slice(0, count)


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns and types (missing ones all null)."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            column = table.column(field.name)
            columns.append(column if column.type == field.type else column.cast(field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _key_at(table: pa.Table, row: int) -> tuple[Any, ...]:
    return tuple(table.column(k)[row].as_py() for k in SORT_KEYS)


def _same_key_as_previous(table: pa.Table) -> np.ndarray:
    """``out[i]`` is True when row ``i + 1`` has the same key as row ``i``."""
    n = table.num_rows
    same = np.ones(max(n - 1, 0), dtype=bool)
    for key in SORT_KEYS:
        column = table.column(key)
        equal = pc.equal(column.slice(1), column.slice(0, n - 1))
        same &= pc.fill_null(equal, False).to_numpy(zero_copy_only=False)
    return same
