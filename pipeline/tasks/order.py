"""Where each task's rows are in a dataset sorted by task, from its Parquet footers.

``task_spans`` lists every task's rows as pieces of row groups, in task order. A row group
whose ``task_id`` (and ``module_id``) statistics hold a single value is placed from its
footer alone; a row group that holds several has its id columns read (never the data
columns) to find where each task starts. Files are ordered by their first task; a task may
continue into the next row group or file, but once it has ended it may not appear again:
such data is refused with a message that names ``offmeta data compact``, which rewrites a
dataset sorted by (task_id, eps_id, t).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, DatasetError
from pipeline.io.arrow_columns import decoded
from pipeline.reads.episodes import DatasetInfo


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of row group ``row_group`` of file ``file`` (an index)."""

    file: int
    row_group: int
    start: int
    stop: int


@dataclass
class Span:
    """One task's rows, in file order."""

    task: str
    rows: int
    counts: dict[str, int]
    """Module -> rows."""
    pieces: list[Piece]


def task_spans(info: DatasetInfo) -> list[Span]:
    """Every task's rows, refusing data whose tasks do not follow each other in order."""
    schema = info.schema
    task_column = schema.column_map.get("task_id", "task_id") if schema.has_task_id else None
    module_column = (
        schema.column_map.get("module_id", "module_id") if schema.has_module_id else None
    )
    per_file = []
    for index, path in enumerate(info.files):
        with info.filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            runs = list(_file_runs(parquet, path, index, task_column, module_column))
        if runs:
            per_file.append(runs)
    per_file.sort(key=lambda runs: (runs[0][0], runs[0][1].file))
    spans: list[Span] = []
    for runs in per_file:
        for task, piece, counts in runs:
            if spans and task == spans[-1].task:
                span = spans[-1]
                span.rows += piece.stop - piece.start
                span.pieces.append(piece)
                for module, count in counts.items():
                    span.counts[module] = span.counts.get(module, 0) + count
                continue
            if spans and task < spans[-1].task:
                raise DatasetError(_unsorted_message(info, task_column, piece, task, spans[-1]))
            spans.append(Span(task, piece.stop - piece.start, dict(counts), [piece]))
    return spans


def _file_runs(
    parquet: pq.ParquetFile,
    path: str,
    file_index: int,
    task_column: str | None,
    module_column: str | None,
) -> Iterator[tuple[str, Piece, dict[str, int]]]:
    """(task, rows, module -> rows) of each run of equal task ids, in file order."""
    metadata = parquet.metadata
    leaves = {metadata.schema.column(i).path: i for i in range(metadata.num_columns)}
    for group in range(metadata.num_row_groups):
        meta = metadata.row_group(group)
        rows = meta.num_rows
        if rows == 0:
            continue
        task = _only_value(meta, leaves, task_column, DEFAULT_TASK_ID)
        module = _only_value(meta, leaves, module_column, DEFAULT_MODULE_ID)
        if task is not None and module is not None:
            yield task, Piece(file_index, group, 0, rows), {module: rows}
            continue
        # Statistics cannot place the task boundaries: read the id columns, nothing else.
        names = [name for name in (task_column, module_column) if name is not None]
        ids = parquet.read_row_group(group, columns=names)
        tasks = _ids(ids, task_column, DEFAULT_TASK_ID, path, group)
        change = pc.not_equal(tasks.slice(1), tasks.slice(0, rows - 1))
        starts = np.concatenate(([0], np.flatnonzero(change.to_numpy(zero_copy_only=False)) + 1))
        stops = np.append(starts[1:], rows)
        modules = pc.dictionary_encode(_ids(ids, module_column, DEFAULT_MODULE_ID, path, group))
        names_of = modules.dictionary.to_pylist()
        run_of_row = np.repeat(np.arange(len(starts)), stops - starts)
        codes = modules.indices.to_numpy(zero_copy_only=False)
        per_run = np.bincount(
            run_of_row * len(names_of) + codes, minlength=len(starts) * len(names_of)
        ).reshape(len(starts), len(names_of))
        for run, task_id in enumerate(tasks.take(pa.array(starts)).to_pylist()):
            counts = {names_of[c]: int(n) for c, n in enumerate(per_run[run]) if n}
            yield task_id, Piece(file_index, group, int(starts[run]), int(stops[run])), counts


def _only_value(
    meta: pq.RowGroupMetaData, leaves: dict[str, int], column: str | None, default: str
) -> str | None:
    """The one value of ``column`` in a row group by its statistics, ``default`` when the
    data has no such column, ``None`` when the statistics do not say."""
    if column is None:
        return default
    statistics = meta.column(leaves[column]).statistics
    if statistics is None or not statistics.has_min_max or statistics.null_count:
        return None
    return statistics.min if statistics.min == statistics.max else None


def _ids(table: pa.Table, column: str | None, default: str, path: str, group: int) -> pa.Array:
    if column is None:
        return pa.array([default] * table.num_rows, pa.string())
    values = decoded(table.column(column)).combine_chunks()
    if values.null_count:
        raise DatasetError(
            f"{path}: column {column!r} has {values.null_count} null values in row group "
            f"{group}; expected an id on every row"
        )
    return values


def _unsorted_message(
    info: DatasetInfo, column: str | None, piece: Piece, task: str, previous: Span
) -> str:
    before = previous.pieces[-1]
    return (
        f"{info.files[piece.file]}: column {column!r} is not sorted by task: row group "
        f"{piece.row_group} holds task {task!r} after task {previous.task!r} (row group "
        f"{before.row_group} of {info.files[before.file]}); streaming task samples reads "
        "whole tasks in windows and needs the rows sorted by (task_id, eps_id, t). Rewrite "
        f"the dataset with `offmeta data compact {info.root} --out DIR`, or read it in "
        "memory (tasks.mode: memory)"
    )
