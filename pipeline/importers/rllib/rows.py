"""RLlib recorder rows in the contract's column types (everything but ``t``)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.integer_range import fitting_cast
from pipeline.contract.schema import DatasetError
from pipeline.importers.columns import is_tensor_field, to_tensor

REQUIRED = ("eps_id", "obs", "actions", "rewards", "terminateds", "truncateds")
_FLAGS = ("terminateds", "truncateds")
_STATES = ("obs", "new_obs")
_MODULE_COLUMNS = ("module_id", "agent_id")


def canonical_rows(table: pa.Table, where: str, task_id: str) -> pa.Table:
    """``table`` (one or more recorder files of one schema) with canonical names and types,
    a ``task_id`` column, null-typed columns dropped and other columns passed through.

    Raises ``DatasetError`` naming ``where``, the column, what was found and what was expected.
    """
    missing = [c for c in REQUIRED if c not in table.column_names]
    if missing:
        raise DatasetError(
            f"{where}: column '{missing[0]}' is missing (found {', '.join(table.column_names)}); "
            f"expected the columns RLlib's offline recorder writes ({', '.join(REQUIRED)}, "
            "new_obs), i.e. a recording made with config.offline_data(output=..., "
            "output_write_episodes=False)"
        )
    columns: dict[str, pa.Array] = {}
    for field in table.schema:
        name, column = field.name, table.column(field.name)
        if pa.types.is_null(field.type) and name not in REQUIRED:
            continue  # RLlib's agent_id/module_id in single-agent runs: no information
        if name in REQUIRED or name in _MODULE_COLUMNS or name == "new_obs":
            _refuse_nulls(column, name, where)
        columns[name] = _convert(field, column, where)
    columns["task_id"] = pa.array([task_id] * table.num_rows, pa.string())
    return pa.table(columns)


def _convert(field: pa.Field, column: pa.ChunkedArray, where: str) -> pa.Array | pa.ChunkedArray:
    name, kind = field.name, field.type
    if name in _STATES:
        if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
            raise DatasetError(
                f"{where}: column '{name}' holds {kind} values (RLlib's compressed columns); "
                "expected tensors: record with config.offline_data(output_compress_columns=[]) "
                "so that observations are stored uncompressed"
            )
        return to_tensor(column, field, where=where)
    if name == "actions":
        if pa.types.is_integer(kind):
            return fitting_cast(column, pa.int64(), where=where, label="'actions'")
        return to_tensor(column, field, where=where)
    if name == "rewards":
        return _cast_number(column, name, pa.float32(), where)
    if name in _FLAGS:
        if not pa.types.is_boolean(kind):
            raise DatasetError(f"{where}: column '{name}' has Arrow type {kind}; expected bool")
        return column
    if name == "eps_id":
        return _cast_id(column, where)
    if name == "module_id":
        return pc.cast(column, pa.string())
    if is_tensor_field(field):
        return to_tensor(column, field, where=where, value_type=None)
    return column


def _cast_number(
    column: pa.ChunkedArray, name: str, target: pa.DataType, where: str
) -> pa.ChunkedArray:
    if not (pa.types.is_floating(column.type) or pa.types.is_integer(column.type)):
        raise DatasetError(
            f"{where}: column '{name}' has Arrow type {column.type}; expected numbers"
        )
    return fitting_cast(column, target, where=where, label=repr(name))


def _cast_id(column: pa.ChunkedArray, where: str) -> pa.ChunkedArray:
    kind = column.type
    if pa.types.is_integer(kind):
        return fitting_cast(column, pa.int64(), where=where, label="'eps_id'")
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.cast(column, pa.string())
    raise DatasetError(
        f"{where}: column 'eps_id' has Arrow type {kind}; expected string or integer ids"
    )


def _refuse_nulls(column: pa.ChunkedArray, name: str, where: str) -> None:
    if column.null_count:
        raise DatasetError(
            f"{where}: column '{name}' holds {column.null_count} null value(s) in "
            f"{len(column)} row(s); expected a value in every row"
        )
