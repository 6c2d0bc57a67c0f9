"""Sort a stream of Arrow tables by key columns in bounded memory (an external merge sort).

1. Runs: tables are gathered until they hold ``run_bytes`` in memory, sorted (stably),
   and written to a scratch Parquet file in ``GROUPS_PER_RUN`` row groups; the key of
   each row group's first and last row is kept. Data that fits in one run is sorted in
   memory and never written.
2. Merge by key ranges: the first keys of all row groups of all runs, sorted, cut the key
   space into ranges. A range holds rows of at most one row group per run (the start of
   any other row group would be a boundary inside it), so the merge holds at most one row
   group per run, takes each run's rows of the range (found by binary search: runs are
   sorted), and sorts only those rows.

Ties keep input order: a row's full key is its key columns, then its run, then its
position in the run, which makes every key distinct and every boundary exact. Memory:
about ``2 * run_bytes`` while a run is sorted, and ``max(1, runs / GROUPS_PER_RUN) *
run_bytes`` while merging.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

GROUPS_PER_RUN = 64
"""Row groups per run file: the merge holds one of them per run."""


def sort_tables(
    tables: Iterable[pa.Table], keys: Sequence[str], *, run_bytes: int, scratch: Path
) -> Iterator[pa.Table]:
    """``tables`` (one schema) as a sequence of tables sorted ascending by ``keys``, ties in
    input order. Key columns must hold no nulls; dictionary columns sort by their values.
    Run files are written in ``scratch`` (an existing directory the caller removes)."""
    held: list[pa.Table] = []
    held_bytes = 0
    runs: list[_Run] = []
    for table in tables:
        held.append(table)
        held_bytes += table.nbytes
        if held_bytes >= run_bytes:
            runs.append(_write_run(_sorted(_concat(held), keys), keys, scratch, len(runs)))
            held, held_bytes = [], 0
    if not runs:
        if held:
            yield _sorted(_concat(held), keys)
        return
    if held:
        runs.append(_write_run(_sorted(_concat(held), keys), keys, scratch, len(runs)))
    yield from _merge(runs, keys)


@dataclass(frozen=True)
class _Run:
    path: Path
    offsets: list[int]
    """Position in the run of each row group's first row."""
    first_keys: list[tuple[Any, ...]]
    """Full key (key columns, run, position) of each row group's first row."""


@dataclass
class _Loaded:
    """One row group of a run, held while the merge takes its rows range by range."""

    run: int
    offset: int
    table: pa.Table
    taken: int = 0
    """Rows already handed out."""
    columns: list[pa.ChunkedArray] = field(default_factory=list)

    def key(self, row: int) -> tuple[Any, ...]:
        return (*(column[row].as_py() for column in self.columns), self.run, self.offset + row)

    def end_before(self, bound: tuple[Any, ...] | None) -> int:
        """The first row at or after ``taken`` whose full key is ``>= bound``."""
        rows = self.table.num_rows
        if bound is None or self.key(rows - 1) < bound:
            return rows
        low, high = self.taken, rows - 1
        while low < high:
            middle = (low + high) // 2
            if self.key(middle) < bound:
                low = middle + 1
            else:
                high = middle
        return low


def _write_run(table: pa.Table, keys: Sequence[str], scratch: Path, index: int) -> _Run:
    path = scratch / f"run-{index:05d}.parquet"
    rows_per_group = max(1, -(-table.num_rows // GROUPS_PER_RUN))
    # Scratch data is read once, right away: fast compression beats small files.
    pq.write_table(table, path, row_group_size=rows_per_group, compression="lz4")
    offsets = list(range(0, table.num_rows, rows_per_group))
    columns = [table.column(name) for name in keys]
    first_keys = [(*(c[at].as_py() for c in columns), index, at) for at in offsets]
    return _Run(path, offsets, first_keys)


def _merge(runs: list[_Run], keys: Sequence[str]) -> Iterator[pa.Table]:
    boundaries = sorted(
        (key, run, group)
        for run, spec in enumerate(runs)
        for group, key in enumerate(spec.first_keys)
    )
    files = [pq.ParquetFile(spec.path) for spec in runs]
    loaded: list[_Loaded | None] = [None] * len(runs)
    try:
        for position, (_, run, group) in enumerate(boundaries):
            upper = boundaries[position + 1][0] if position + 1 < len(boundaries) else None
            # Every row of the run's previous row group is below this boundary: handed out.
            assert loaded[run] is None, f"run {run}: row group {group - 1} not fully merged"
            table = files[run].read_row_group(group)
            loaded[run] = _Loaded(
                run, runs[run].offsets[group], table, columns=[table.column(k) for k in keys]
            )
            pieces = []
            for index, current in enumerate(loaded):
                if current is None:
                    continue
                end = current.end_before(upper)
                if end > current.taken:
                    pieces.append(current.table.slice(current.taken, end - current.taken))
                    current.taken = end
                if current.taken == current.table.num_rows:
                    loaded[index] = None
            if pieces:
                yield _sorted(_concat(pieces), keys)
    finally:
        for file in files:
            file.close()


def _sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``table`` stably sorted by ``keys`` (dictionary columns by their values)."""
    key_table = pa.table({name: _decoded(table.column(name)) for name in keys})
    order = pc.sort_indices(key_table, sort_keys=[(name, "ascending") for name in keys])
    return table.take(order)


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return pa.chunked_array(
            [chunk.dictionary_decode() for chunk in column.chunks], column.type.value_type
        )
    return column


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
