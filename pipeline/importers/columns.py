"""Column conversions shared by the importers: other tools' tensor encodings into
``fixed_shape_tensor``, row hashes, and exact row comparison.

Ray writes tensor columns as its ``ArrowTensorType``/``ArrowTensorTypeV2`` extension: a
``list``/``large_list`` storage array whose field metadata names the extension and holds the
shape as JSON (``ARROW:extension:name = ray.data.arrow_tensor_v2``,
``ARROW:extension:metadata = [4]``). Without Ray imported, pyarrow reads such a column as its
plain storage with that metadata; with Ray imported, as Ray's registered extension type. Both
are read here from the storage and the serialized shape, so the importers never need Ray.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.integer_range import fitting_cast
from pipeline.contract.schema import DatasetError

_EXTENSION_NAME = b"ARROW:extension:name"
_EXTENSION_METADATA = b"ARROW:extension:metadata"
_RAY_TENSOR_PREFIX = "ray.data.arrow_tensor"
_HASH_PRIME = np.uint64(0x100000001B3)
_HASH_SEED = np.uint64(0xCBF29CE484222325)
FLOAT32 = pa.float32()


def is_tensor_field(field: pa.Field) -> bool:
    """Whether ``field`` holds one tensor per row in an encoding ``to_tensor`` reads."""
    kind = field.type
    if isinstance(kind, pa.ExtensionType):
        return kind.extension_name.startswith(_RAY_TENSOR_PREFIX) or isinstance(
            kind, pa.FixedShapeTensorType
        )
    return pa.types.is_fixed_size_list(kind) or _ray_shape_from_metadata(field) is not None


def to_tensor(
    column: pa.ChunkedArray | pa.Array,
    field: pa.Field,
    *,
    where: str,
    value_type: pa.DataType | None = FLOAT32,
    shape: tuple[int, ...] | None = None,
) -> pa.FixedShapeTensorArray:
    """``column`` (a Ray tensor column, ``fixed_size_list``, ``fixed_shape_tensor`` or a plain
    number column) as ``fixed_shape_tensor``; numbers become shape ``(1,)``.

    ``value_type`` is the element type of the result (``None`` keeps the source's); ``shape``
    reshapes each row (a flattened ``fixed_size_list`` of a space of that shape). Raises
    ``DatasetError`` naming ``where`` and the column when rows differ in size.
    """
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    found, storage = _shape_and_storage(array, field)
    if storage is None:
        if not (pa.types.is_integer(array.type) or pa.types.is_floating(array.type)):
            raise DatasetError(
                f"{where}: column '{field.name}' has Arrow type {array.type}; expected a tensor "
                "column (Ray tensor, fixed_size_list or fixed_shape_tensor) or numbers"
            )
        shape, values = (1,), array
    else:
        shape = found if shape is None else shape
        values = _flat_values(storage, math.prod(shape), field.name, where)
    if values.null_count:
        raise DatasetError(
            f"{where}: column '{field.name}' holds {values.null_count} null value(s); expected "
            "every row to hold a complete tensor"
        )
    if value_type is not None:
        values = fitting_cast(values, value_type, where=where, label=repr(field.name))
    flat = values.to_numpy(zero_copy_only=False)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(flat.reshape(len(array), *shape))


def tensor_rows(array: pa.FixedShapeTensorArray) -> np.ndarray:
    """Rows of a ``fixed_shape_tensor`` array as a 2-D numpy array ``[rows, elements]``."""
    width = math.prod(array.type.shape)
    flat = array.storage.flatten().to_numpy(zero_copy_only=False)
    return flat.reshape(len(array), width)


def row_hashes(array: pa.FixedShapeTensorArray) -> np.ndarray:
    """A 64-bit FNV-style hash of each row's bytes (uint64 per row): equal rows hash equal.

    Used only to recognise a repeated first step; repeated rows are compared exactly."""
    rows = np.ascontiguousarray(tensor_rows(array))
    words = rows.view(np.uint8).reshape(len(rows), -1)
    pad = (-words.shape[1]) % 8
    if pad:
        words = np.pad(words, ((0, 0), (0, pad)))
    words = np.ascontiguousarray(words).view(np.uint64)
    hashes = np.full(len(rows), _HASH_SEED, dtype=np.uint64)
    for j in range(words.shape[1]):
        hashes = (hashes ^ words[:, j]) * _HASH_PRIME
    return hashes


def first_difference(
    table: pa.Table, left: np.ndarray, right: np.ndarray
) -> tuple[int, str] | None:
    """The first pair ``(left[k], right[k])`` of rows of ``table`` that differ, and the first
    column where they differ; ``None`` when every pair is equal in every column.

    Floats compare by their bits, so NaN equals NaN and 0.0 differs from -0.0: a repeated
    row must be an exact copy."""
    if len(left) == 0:
        return None
    differs = np.zeros(len(left), dtype=bool)
    first_column = np.full(len(left), -1)
    for index, name in enumerate(table.column_names):
        column = table.column(name)
        a, b = column.take(pa.array(left)), column.take(pa.array(right))
        unequal = ~_equal_rows(a.combine_chunks(), b.combine_chunks())
        first_column[unequal & ~differs] = index
        differs |= unequal
    if not differs.any():
        return None
    pair = int(np.argmax(differs))
    return pair, table.column_names[first_column[pair]]


def _equal_rows(a: pa.Array, b: pa.Array) -> np.ndarray:
    if isinstance(a, pa.ExtensionArray):
        a, b = a.storage, b.storage
    if pa.types.is_fixed_size_list(a.type):
        width = a.type.list_size
        left, right = _bits(a.flatten()).reshape(-1, width), _bits(b.flatten()).reshape(-1, width)
        same = (left == right).all(axis=1) if width else np.ones(len(a), dtype=bool)
        return same & _same_validity(a, b)
    if pa.types.is_floating(a.type):
        return (_bits(a) == _bits(b)) & _same_validity(a, b)
    equal = pc.fill_null(pc.equal(a, b), False).to_numpy(zero_copy_only=False)
    both_null = pc.and_(pc.is_null(a), pc.is_null(b)).to_numpy(zero_copy_only=False)
    return equal | both_null


def _bits(array: pa.Array) -> np.ndarray:
    values = array.fill_null(0) if array.null_count else array
    numbers = values.to_numpy(zero_copy_only=False)
    if numbers.dtype.kind == "f":
        return numbers.view(f"u{numbers.dtype.itemsize}")
    return numbers


def _same_validity(a: pa.Array, b: pa.Array) -> np.ndarray:
    return pc.equal(pc.is_valid(a), pc.is_valid(b)).to_numpy(zero_copy_only=False)


def _shape_and_storage(array: pa.Array, field: pa.Field) -> tuple[tuple[int, ...], pa.Array | None]:
    kind = array.type
    if isinstance(kind, pa.FixedShapeTensorType):
        return tuple(kind.shape), array.storage
    if isinstance(kind, pa.ExtensionType) and kind.extension_name.startswith(_RAY_TENSOR_PREFIX):
        return _parse_shape(kind.__arrow_ext_serialize__(), field.name), array.storage
    if pa.types.is_fixed_size_list(kind):
        return (kind.list_size,), array
    shape = _ray_shape_from_metadata(field)
    if shape is not None:
        return shape, array
    return (), None


def _ray_shape_from_metadata(field: pa.Field) -> tuple[int, ...] | None:
    metadata = field.metadata or {}
    name = metadata.get(_EXTENSION_NAME, b"").decode(errors="replace")
    if not name.startswith(_RAY_TENSOR_PREFIX):
        return None
    return _parse_shape(metadata.get(_EXTENSION_METADATA, b""), field.name)


def _parse_shape(serialized: bytes, name: str) -> tuple[int, ...]:
    try:
        shape = json.loads(serialized)
    except (json.JSONDecodeError, UnicodeDecodeError):
        shape = None
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise DatasetError(
            f"column '{name}': Ray tensor metadata {serialized!r} is not a shape; expected a JSON "
            "list of sizes such as [4] (Ray writes it as ARROW:extension:metadata)"
        )
    return tuple(shape)


def _flat_values(storage: pa.Array, width: int, name: str, where: str) -> pa.Array:
    """The values of a list-typed ``storage`` whose every row holds ``width`` elements."""
    if storage.null_count:
        raise DatasetError(
            f"{where}: column '{name}' holds {storage.null_count} null row(s); expected every "
            "row to hold a complete tensor"
        )
    if pa.types.is_fixed_size_list(storage.type):
        if storage.type.list_size != width:
            raise DatasetError(
                f"{where}: column '{name}' holds {storage.type.list_size} values per row; "
                f"expected {width} (the tensor shape's size)"
            )
        return storage.flatten()
    if not (pa.types.is_list(storage.type) or pa.types.is_large_list(storage.type)):
        raise DatasetError(
            f"{where}: column '{name}' stores tensors as {storage.type}; expected a list type"
        )
    lengths = pc.list_value_length(storage).to_numpy(zero_copy_only=False)
    wrong = np.flatnonzero(lengths != width)
    if len(wrong):
        raise DatasetError(
            f"{where}: column '{name}' row {int(wrong[0])} holds {int(lengths[wrong[0]])} values; "
            f"expected {width} in every row (one shape per column)"
        )
    return storage.flatten()
