"""Small Arrow column helpers shared across the pipeline (pyarrow only)."""

from __future__ import annotations

import pyarrow as pa


def decoded(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``column`` with dictionary-encoded values decoded (as it is otherwise)."""
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column
