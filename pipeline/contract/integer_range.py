"""Integers are never read into a narrower type than they hold unless every value fits.

Reads hold ``t`` as int32 (int64 is accepted on disk), importers turn other tools' integer
columns into int64 ids and actions and float32 tensors. A cast that does not fit would
wrap, round or, with pyarrow's safe casts, fail in the middle of a read as a traceback;
instead a value that does not fit is refused in one line naming the file, the column and
the first value.

``check_step_range`` runs with validation: an int64 ``t`` is cleared by its footer
statistics when every row group has them inside int32; otherwise the file's ``t`` and
``eps_id`` are read (as the null checks read a column the footers do not clear).
``fitting_cast`` is the one cast reads and importers use for integer columns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract.footer_checks import FileFacts, column_label, read_columns
from pipeline.contract.schema import DatasetError
from pipeline.io.dataset_source import ResolvedSource
from pipeline.io.parquet_files import leaf_index

STEP_TYPE = pa.int32()
"""The type reads hold ``t`` in."""


def check_step_range(
    resolved: ResolvedSource, facts: Sequence[FileFacts], column_map: Mapping[str, str]
) -> None:
    """Refuse an int64 ``t`` holding a value outside int32, naming the file, the column, the
    first such value and its episode."""
    on_disk = [column_map.get(name, name) for name in ("t", "eps_id")]
    for fact in facts:
        if not pa.types.is_int64(fact.types["t"]) or _cleared(resolved, fact.path, on_disk[0]):
            continue
        table = read_columns(resolved, fact.path, on_disk)
        steps = table.column(0)
        first = _first_outside(steps, STEP_TYPE)
        if first is not None:
            eps_id = table.column(1)[first].as_py()
            raise DatasetError(
                f"{fact.path}: column {column_label('t', column_map)} holds "
                f"{steps[first].as_py()} at eps_id {eps_id!r}, which does not fit "
                f"{_describe(STEP_TYPE)}, the type reads hold steps in; expected steps in "
                f"{_bounds_text(STEP_TYPE)}. Fix: number each episode's steps from 0"
            )


def fitting_cast(
    column: pa.ChunkedArray | pa.Array, target: pa.DataType, *, where: str, label: str
) -> pa.ChunkedArray | pa.Array:
    """``column`` cast to ``target``; an integer column holding a value that ``target``
    cannot hold exactly is refused, naming ``where`` (a file), the column ``label`` and the
    first value that does not fit."""
    if column.type == target:
        return column
    if pa.types.is_integer(column.type):
        first = _first_outside(column, target)
        if first is not None:
            raise DatasetError(
                f"{where}: column {label} holds {column[first].as_py()} (row {first}), which "
                f"does not fit {_describe(target)}; expected values in {_bounds_text(target)}. "
                "Fix: store the column in a type its values fit"
            )
    return pc.cast(column, target)


def with_step_type(table: pa.Table, *, where: str) -> pa.Table:
    """``table`` with its ``t`` column (canonical name) in ``STEP_TYPE``."""
    index = table.schema.get_field_index("t")
    if index < 0 or table.schema.field(index).type == STEP_TYPE:
        return table
    steps = fitting_cast(table.column(index), STEP_TYPE, where=where, label="'t'")
    return table.set_column(index, "t", steps)


def _first_outside(column: pa.ChunkedArray | pa.Array, target: pa.DataType) -> int | None:
    """Position of the first value outside what ``target`` holds exactly; None if none."""
    low, high = _bounds(target)
    extremes = pc.min_max(column)
    smallest, largest = extremes["min"].as_py(), extremes["max"].as_py()
    if smallest is None or (smallest >= low and largest <= high):
        return None
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    offset = 0
    for chunk in chunks:
        values = chunk.to_numpy(zero_copy_only=False)
        outside = np.flatnonzero((values < low) | (values > high))
        if len(outside):
            return offset + int(outside[0])
        offset += len(chunk)
    return None


def _bounds(target: pa.DataType) -> tuple[int, int]:
    """The integers ``target`` holds exactly."""
    if pa.types.is_integer(target):
        info = np.iinfo(target.to_pandas_dtype())
        return int(info.min), int(info.max)
    exact = 2 ** (np.finfo(target.to_pandas_dtype()).nmant + 1)
    return -exact, exact


def _bounds_text(target: pa.DataType) -> str:
    low, high = _bounds(target)
    return f"[{low}, {high}]"


def _describe(target: pa.DataType) -> str:
    return {"float": "float32", "double": "float64"}.get(str(target), str(target))


def _cleared(resolved: ResolvedSource, path: str, column: str) -> bool:
    """Whether every row group's statistics put ``column`` inside ``STEP_TYPE``."""
    low, high = _bounds(STEP_TYPE)
    with resolved.filesystem.open_input_file(path) as handle:
        footer = pq.ParquetFile(handle)
        leaf = leaf_index(footer, column)
        for group in range(footer.num_row_groups):
            stats = footer.metadata.row_group(group).column(leaf).statistics
            if stats is None or not stats.has_min_max or not low <= stats.min <= stats.max <= high:
                return False
    return True
