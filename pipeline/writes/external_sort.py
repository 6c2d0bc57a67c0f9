"""Sort a stream of Arrow tables by key columns in bounded memory (an external merge sort).

1. Runs: tables are gathered until they hold ``run_bytes`` in memory, sorted (stably),
   and written to a scratch Arrow IPC file in ``GROUPS_PER_RUN`` row groups (record
   batches); the key of each row group's first row is kept. Data that fits in one run is
   sorted in memory and never written.
2. Merge by key ranges: the first keys of all row groups of all runs, sorted, cut the key
   space into ranges. A range holds rows of at most one row group per run (the start of
   any other row group would be a boundary inside it), so the merge holds at most one row
   group per run, takes each run's rows of the range (found by binary search: runs are
   sorted), and sorts only those rows.
3. Passes: more than ``GROUPS_PER_RUN`` runs are first merged ``GROUPS_PER_RUN`` at a time
   into longer runs (row groups of the same size, their inputs removed), until at most
   ``GROUPS_PER_RUN`` are left, so a merge never holds more than that many row groups.

Ties keep input order: a row's full key is its key columns, then its run, then its
position in the run, which makes every key distinct and every boundary exact (a pass merges
consecutive runs, so run order stays input order). Memory: about ``2 * run_bytes`` while a
run is sorted, about ``run_bytes`` while merging, whatever the number of rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

GROUPS_PER_RUN = 64
"""Row groups per run file, and runs per merge: a merge holds one row group per run."""
_SCRATCH = pa.ipc.IpcWriteOptions(compression="lz4")
"""Runs are Arrow IPC files, a row group per record batch, read once, right away: Parquet
took 3-5 times as long to write and read back (a 68 MiB RLlib import chunk, with and without
dictionaries and statistics), and LZ4 keeps them near the size of compressed Parquet."""


def sort_tables(
    tables: Iterable[pa.Table], keys: Sequence[str], *, run_bytes: int, scratch: Path
) -> Iterator[pa.Table]:
    """``tables`` as a sequence of tables sorted ascending by ``keys``, ties in input order.

    Input schemas may differ where pyarrow's permissive promotion unifies them (a column
    missing from some tables is null there); every table out has the unified schema. Key
    columns must hold no nulls; dictionary columns sort by their values. Run files are
    written in ``scratch`` (an existing directory the caller removes). Nothing is yielded
    before every input table is read.
    """
    held: list[pa.Table] = []
    held_bytes = 0
    schemas: list[pa.Schema] = []
    runs: list[_Run] = []
    for table in tables:
        if not any(table.schema.equals(known) for known in schemas):
            schemas.append(table.schema)
        held.append(table)
        held_bytes += table.nbytes
        if held_bytes >= run_bytes:
            runs.append(_write_run(_sorted(_concat(held), keys), keys, scratch, len(runs)))
            held, held_bytes = [], 0
    if not schemas:
        return
    schema = pa.unify_schemas(schemas, promote_options="permissive")
    if not runs:
        yield _sorted(_conformed(_concat(held), schema), keys)
        return
    if held:
        runs.append(_write_run(_sorted(_concat(held), keys), keys, scratch, len(runs)))
    depth = 0
    while len(runs) > GROUPS_PER_RUN:
        depth += 1
        runs = [
            _merge_to_run(runs[start : start + GROUPS_PER_RUN], keys, schema, scratch, depth)
            for start in range(0, len(runs), GROUPS_PER_RUN)
        ]
    yield from _merge(runs, keys, schema)


@dataclass(frozen=True)
class _Run:
    path: Path
    index: int
    """Position among the runs of its pass: the tie-breaker after the key columns."""
    group_rows: int
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
    group_rows = max(1, -(-table.num_rows // GROUPS_PER_RUN))
    batches = table.to_batches(max_chunksize=group_rows)
    path = scratch / f"run-{index:05d}.arrow"
    return _spill(batches, table.schema, keys, path, index, group_rows)


def _merge_to_run(
    runs: list[_Run], keys: Sequence[str], schema: pa.Schema, scratch: Path, depth: int
) -> _Run:
    """``runs`` merged into one run of row groups as large as their largest; they are removed."""
    index = runs[0].index // GROUPS_PER_RUN
    group_rows = max(run.group_rows for run in runs)
    groups = _regrouped(_merge(runs, keys, schema), group_rows)
    batches = (batch for group in groups for batch in group.to_batches())
    path = scratch / f"merged-{depth}-{index:05d}.arrow"
    merged = _spill(batches, schema, keys, path, index, group_rows)
    for run in runs:
        run.path.unlink()
    return merged


def _spill(
    batches: Iterable[pa.RecordBatch],
    schema: pa.Schema,
    keys: Sequence[str],
    path: Path,
    index: int,
    group_rows: int,
) -> _Run:
    """Write a sorted run, one row group per record batch, keeping each one's first key."""
    offsets: list[int] = []
    first_keys: list[tuple[Any, ...]] = []
    position = 0
    with pa.ipc.new_file(path, schema, options=_SCRATCH) as writer:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            offsets.append(position)
            first_keys.append((*(batch.column(k)[0].as_py() for k in keys), index, position))
            writer.write_batch(batch)
            position += batch.num_rows
    return _Run(path, index, group_rows, offsets, first_keys)


def _regrouped(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """The rows of ``tables`` in order, as tables of ``rows`` rows (the last: the rest)."""
    held: list[pa.Table] = []
    held_rows = 0
    for table in tables:
        held.append(table)
        held_rows += table.num_rows
        if held_rows < rows:
            continue
        joined = _concat(held)
        start = 0
        while joined.num_rows - start >= rows:
            yield joined.slice(start, rows)
            start += rows
        held, held_rows = [joined.slice(start)], joined.num_rows - start
    if held_rows:
        yield _concat(held)


def _merge(runs: list[_Run], keys: Sequence[str], schema: pa.Schema) -> Iterator[pa.Table]:
    boundaries = sorted(
        (key, run, group)
        for run, spec in enumerate(runs)
        for group, key in enumerate(spec.first_keys)
    )
    files = [pa.OSFile(str(spec.path)) for spec in runs]
    loaded: list[_Loaded | None] = [None] * len(runs)
    try:
        readers = [pa.ipc.open_file(file) for file in files]
        for position, (_, run, group) in enumerate(boundaries):
            upper = boundaries[position + 1][0] if position + 1 < len(boundaries) else None
            # Every row of the run's previous row group is below this boundary: handed out.
            assert loaded[run] is None, f"run {run}: row group {group - 1} not fully merged"
            batch = readers[run].get_batch(group)
            table = _conformed(pa.Table.from_batches([batch]), schema)
            loaded[run] = _Loaded(
                runs[run].index,
                runs[run].offsets[group],
                table,
                columns=[table.column(k) for k in keys],
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


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns, in its order and types (missing: null)."""
    if table.schema.equals(schema):
        return table
    columns = []
    for target in schema:
        if target.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, target.type))
            continue
        column = table.column(target.name)
        columns.append(column if column.type == target.type else column.cast(target.type))
    return pa.Table.from_arrays(columns, schema=schema)


def _concat(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive")
