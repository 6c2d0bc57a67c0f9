"""Arrow columns as numpy arrays, without torch: which columns a stream delivers by default,
each row's module, and a column's values as one array. Shared by collate
(``pipeline.streams.collate``, which makes tensors of them) and by the checks and plans that
run before any tensor is made (task windows, ``offmeta run``'s data checks), which so never
import torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.schema import DEFAULT_MODULE_ID

MODULE_COLUMN = "module_id"
TRAINING_COLUMNS = ("obs", "actions", "rewards", "new_obs", "terminateds", "truncateds")
"""Columns a stream delivers when none are named, in this order, where the data has them."""


def default_columns(column_names: Collection[str]) -> tuple[str, ...]:
    """The training columns present among ``column_names``."""
    return tuple(name for name in TRAINING_COLUMNS if name in column_names)


def module_codes(table: pa.Table) -> tuple[np.ndarray, list[str]]:
    """Per-row module codes into a sorted list of module ids, from dictionary codes.

    No per-row Python: each chunk is dictionary-encoded (a no-op when it already is) and
    its small dictionary is mapped onto the sorted ids.
    """
    if MODULE_COLUMN not in table.column_names:
        return np.zeros(table.num_rows, dtype=np.int64), [DEFAULT_MODULE_ID]
    column = table.column(MODULE_COLUMN)
    if column.null_count:
        raise ValueError(
            f"column {MODULE_COLUMN!r} has {column.null_count} null values; every row needs "
            f"a module id (drop the column to put all rows in {DEFAULT_MODULE_ID!r})"
        )
    chunks = [
        chunk if pa.types.is_dictionary(chunk.type) else pc.dictionary_encode(chunk)
        for chunk in column.chunks
    ]
    if len(chunks) == 1:
        # The usual block: one chunk whose dictionary is already the sorted ids, so its
        # indices are the codes (every super-batch of a stream comes this way).
        dictionary = [str(name) for name in chunks[0].dictionary.to_pylist()]
        if all(a < b for a, b in itertools.pairwise(dictionary)):
            return chunks[0].indices.to_numpy(zero_copy_only=False), dictionary
    names = sorted({str(name) for chunk in chunks for name in chunk.dictionary.to_pylist()})
    position = {name: code for code, name in enumerate(names)}
    parts = [
        np.array([position[str(n)] for n in chunk.dictionary.to_pylist()], dtype=np.int64)[
            chunk.indices.to_numpy(zero_copy_only=False)
        ]
        for chunk in chunks
    ]
    codes = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return codes, names


def column_array(table: pa.Table, name: str) -> np.ndarray:
    """Column ``name`` as one numpy array ``[rows, *shape]``, zero-copy for a single chunk."""
    column = table.column(name)
    if column.null_count:
        raise ValueError(
            f"column {name!r} has {column.null_count} null values; tensors cannot hold nulls"
        )
    parts = [_chunk_array(name, chunk) for chunk in column.chunks]
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return _chunk_array(name, column.combine_chunks())
    return np.concatenate(parts)


def _chunk_array(name: str, chunk: pa.Array) -> np.ndarray:
    kind = chunk.type
    if isinstance(kind, pa.FixedShapeTensorType):
        return chunk.to_numpy_ndarray()
    if pa.types.is_fixed_size_list(kind):
        values = _chunk_array(name, chunk.flatten())
        return values.reshape(len(chunk), kind.list_size, *values.shape[1:])
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        return chunk.to_numpy(zero_copy_only=False)
    raise TypeError(
        f"column {name!r} has Arrow type {kind}; only numeric, bool, fixed_shape_tensor and "
        "fixed_size_list columns become tensors (leave it out of columns=)"
    )
