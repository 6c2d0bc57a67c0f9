"""Check Parquet files against the episode contract from their footers.

Opening a ``ParquetFile`` reads the footer (schema, row counts, per-column null counts),
never the data, so a bad dataset is refused in milliseconds, before Ray starts a single
task. Only a column whose footer statistics report nulls, or carry no null count, is read
to count them.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract.schema import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, DatasetError, EpisodeSchema
from pipeline.io.dataset_source import ResolvedSource
from pipeline.io.parquet_files import map_files

CANONICAL_COLUMNS = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
_TENSOR = "fixed_shape_tensor<float32> or fixed_size_list<float32>"
_OBSERVATION = f"{_TENSOR}, or fixed_shape_tensor<uint8> of 3 dimensions (images)"
_EXPECTED = {
    "eps_id": ("string or int64", "store episode ids as strings or int64"),
    "t": ("int32 or int64", "store step indices as integers"),
    "obs": (
        _OBSERVATION,
        "write observations with pyarrow.FixedShapeTensorArray.from_numpy_ndarray"
        "(obs.astype('float32')), images as uint8 [rows, C, H, W] or [rows, H, W, C]; "
        "a 1-D observation has shape (1,)",
    ),
    "new_obs": (
        _OBSERVATION,
        "write next observations like 'obs', with "
        "pyarrow.FixedShapeTensorArray.from_numpy_ndarray(new_obs.astype('float32'))",
    ),
    "actions": (
        f"int64 (discrete) or {_TENSOR}",
        "store discrete actions as int64, continuous ones with "
        "pyarrow.FixedShapeTensorArray.from_numpy_ndarray(actions.astype('float32')); "
        "a scalar target has shape (1,)",
    ),
    "rewards": ("float32", "cast with pyarrow.compute.cast(rewards, pyarrow.float32())"),
    "terminateds": ("bool", "store episode-end flags as booleans"),
    "truncateds": ("bool", "store episode-end flags as booleans"),
    "task_id": ("string or dictionary<string>", "store task ids as strings"),
    "module_id": ("string or dictionary<string>", "store module ids as strings"),
}
_STRINGS = (pa.string(), pa.large_string())
_SHOWN_FILES = 5


@dataclass(frozen=True)
class FileFacts:
    """What one file's footer says, in canonical column names."""

    path: str
    num_rows: int
    types: dict[str, pa.DataType]
    """Canonical name (or the disk name for columns outside the contract) -> Arrow type."""
    maybe_null: tuple[str, ...] = ()
    """Canonical columns whose footer statistics report nulls or do not count them."""
    row_groups: int = 1
    """Row groups in the file: the value checks read (and sample) one at a time."""


def check_column_map(column_map: Mapping[str, str] | None) -> dict[str, str]:
    """Refuse a column map that names no canonical column or maps two onto one."""
    mapping = dict(column_map or {})
    for canonical, on_disk in mapping.items():
        if canonical not in CANONICAL_COLUMNS:
            raise DatasetError(
                f"column_map: unknown canonical column {canonical!r} (mapped to {on_disk!r}); "
                f"expected one of {', '.join(CANONICAL_COLUMNS)} as keys (canonical name -> "
                "name on disk)"
            )
    seen: dict[str, str] = {}
    for canonical, on_disk in mapping.items():
        if on_disk in seen:
            raise DatasetError(
                f"column_map: {seen[on_disk]!r} and {canonical!r} both map to {on_disk!r}; "
                "expected each column on disk to feed one canonical column"
            )
        seen[on_disk] = canonical
    return {c: d for c, d in mapping.items() if c != d}


def read_footers(resolved: ResolvedSource, column_map: Mapping[str, str]) -> list[FileFacts]:
    """Open every file's footer and check its columns; types are compared across files later.

    A few threads open the files: an open is latency that pyarrow waits out without the
    GIL (milliseconds per file on object storage), which thousands of small files add up.
    """
    return map_files(functools.partial(_file_facts, resolved, column_map), resolved.files)


def _file_facts(resolved: ResolvedSource, column_map: Mapping[str, str], path: str) -> FileFacts:
    try:
        with resolved.filesystem.open_input_file(path) as handle:
            footer = pq.ParquetFile(handle)
            schema, metadata = footer.schema_arrow, footer.metadata
    except (pa.ArrowInvalid, OSError) as exc:
        reason = " ".join(str(exc).split())
        raise DatasetError(
            f"{path}: not a readable Parquet file ({reason}); expected a complete Parquet "
            "file (was it truncated while being written, or is it another format?)"
        ) from None
    _refuse_repeated_names(path, schema.names)
    types = _canonical_types(path, schema, column_map)
    maybe_null = _maybe_null(metadata, schema, column_map)
    return FileFacts(path, metadata.num_rows, types, maybe_null, metadata.num_row_groups)


def _refuse_repeated_names(path: str, names: list[str]) -> None:
    """Parquet allows two columns of one name; every read by name would pick one of them."""
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise DatasetError(
            f"{path}: column {repeated!r} appears {names.count(repeated)} times; expected "
            "each column name once. Fix: rename or drop the repeated columns"
        )


def check_nulls(
    resolved: ResolvedSource, facts: list[FileFacts], column_map: Mapping[str, str]
) -> None:
    """Refuse nulls in canonical columns: a null ``obs`` or ``t`` has no meaning to a
    learner. Only the columns the footers could not clear are read."""
    for fact in facts:
        if not fact.maybe_null:
            continue
        table = read_columns(resolved, fact.path, [column_map.get(c, c) for c in fact.maybe_null])
        for column, values in zip(fact.maybe_null, table.columns, strict=True):
            rows = _null_rows(values)
            if rows:
                raise DatasetError(
                    f"{fact.path}: column {column_label(column, column_map)} has nulls in "
                    f"{rows} of {fact.num_rows} rows; expected a value in every row of every "
                    "canonical column. Fix: drop or fill those rows"
                )


def read_columns(resolved: ResolvedSource, path: str, columns: list[str]) -> pa.Table:
    """Read some columns of one file whose footer was checked; refuse damaged data by name."""
    try:
        with resolved.filesystem.open_input_file(path) as handle:
            return pq.ParquetFile(handle).read(columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, columns, exc) from None


def read_row_groups(resolved: ResolvedSource, path: str, columns: list[str]) -> Iterator[pa.Table]:
    """``read_columns`` one row group at a time, for readers that hold one at a time."""
    try:
        with resolved.filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=columns)
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, columns, exc) from None


def _unreadable(path: str, columns: list[str], exc: Exception) -> DatasetError:
    return DatasetError(
        f"{path}: columns {', '.join(columns)} cannot be read ({' '.join(str(exc).split())}); "
        "expected readable Parquet data behind a valid footer (is the file corrupted?)"
    )


def build_schema(
    resolved: ResolvedSource, facts: list[FileFacts], column_map: Mapping[str, str]
) -> EpisodeSchema:
    """Check that all files agree with the first one and describe them as one schema."""
    first = facts[0]
    for other in facts[1:]:
        _same_columns(first, other, column_map)
    obs_type = first.types["obs"]
    obs_shape = _observation_shape(obs_type)
    actions = first.types["actions"]
    discrete = pa.types.is_int64(actions)
    assert obs_shape is not None
    if "new_obs" in first.types:
        new_obs_type = first.types["new_obs"]
        if _observation_shape(new_obs_type) != obs_shape:
            raise DatasetError(
                f"{first.path}: column {column_label('new_obs', column_map)} has shape "
                f"{list(_observation_shape(new_obs_type) or ())} but 'obs' has shape "
                f"{list(obs_shape)}; expected 'new_obs' to have the shape of 'obs'"
            )
        if is_image(new_obs_type) != is_image(obs_type):
            raise DatasetError(
                f"{first.path}: column {column_label('new_obs', column_map)} has type "
                f"{describe_type(new_obs_type)} but 'obs' has type {describe_type(obs_type)}; "
                "expected 'new_obs' to have the element type of 'obs'"
            )
    total = sum(f.num_rows for f in facts)
    if total == 0:
        shown = ", ".join(f.path for f in facts[:_SHOWN_FILES])
        more = f" and {len(facts) - _SHOWN_FILES} more" if len(facts) > _SHOWN_FILES else ""
        raise DatasetError(
            f"source {resolved.description!r}: 0 rows in {len(facts)} file(s) ({shown}{more}); "
            "expected at least one transition (were the files written before any data "
            "arrived?)"
        )
    return EpisodeSchema(
        obs_shape=obs_shape,
        action_shape=() if discrete else (_tensor_shape(actions) or ()),
        discrete_actions=discrete,
        eps_id_type="int64" if pa.types.is_int64(first.types["eps_id"]) else "string",
        has_new_obs="new_obs" in first.types,
        has_task_id="task_id" in first.types,
        has_module_id="module_id" in first.types,
        extra_columns=tuple(c for c in first.types if c not in CANONICAL_COLUMNS),
        column_map=dict(column_map),
        obs_layout="CHW" if is_image(obs_type) else None,
    )


def is_image(arrow_type: pa.DataType) -> bool:
    """Whether a column type holds uint8 images (3-D ``fixed_shape_tensor<uint8>``)."""
    return (
        isinstance(arrow_type, pa.FixedShapeTensorType)
        and pa.types.is_uint8(arrow_type.value_type)
        and len(arrow_type.shape) == 3
    )


def describe_type(arrow_type: pa.DataType) -> str:
    """Arrow type in the contract's words, e.g. ``fixed_shape_tensor<float32>[2]``."""
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        shape = ",".join(str(d) for d in arrow_type.shape)
        return f"fixed_shape_tensor<{describe_type(arrow_type.value_type)}>[{shape}]"
    if pa.types.is_fixed_size_list(arrow_type):
        return f"fixed_size_list<{describe_type(arrow_type.value_type)}>[{arrow_type.list_size}]"
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        return f"{str(arrow_type).split('<')[0]}<{describe_type(arrow_type.value_type)}>"
    if pa.types.is_dictionary(arrow_type):
        return f"dictionary<{describe_type(arrow_type.value_type)}>"
    names = {"float": "float32", "double": "float64", "halffloat": "float16"}
    return names.get(str(arrow_type), str(arrow_type))


def _canonical_types(
    path: str, schema: pa.Schema, column_map: Mapping[str, str]
) -> dict[str, pa.DataType]:
    renamed_from = {on_disk: canonical for canonical, on_disk in column_map.items()}
    names = schema.names
    for canonical, on_disk in column_map.items():
        if on_disk not in names:
            kind = "required column" if canonical in REQUIRED_COLUMNS else "column"
            raise DatasetError(
                f"{path}: missing {kind} {canonical!r} (read from {on_disk!r} by column_map); "
                f"found columns {', '.join(names)}. Fix: correct the column map"
            )
        if canonical in names and canonical not in renamed_from:
            raise DatasetError(
                f"{path}: column_map reads {canonical!r} from {on_disk!r}, but the file also "
                f"has a column named {canonical!r}; expected only one of them (rename or "
                "drop the other column)"
            )
    types = {renamed_from.get(n, n): schema.field(n).type for n in names}
    for column in REQUIRED_COLUMNS:
        if column not in types:
            raise DatasetError(
                f"{path}: missing required column {column!r}; found columns "
                f"{', '.join(names)}. Fix: add it, or map it with column_map="
                f"{{'{column}': '<name on disk>'}} (--column-map {column}=<name on disk>)"
            )
    for column in ("obs", "new_obs"):
        arrow_type = types.get(column)
        if _uint8_tensor(arrow_type) and not is_image(arrow_type):
            raise DatasetError(
                f"{path}: column {column_label(column, column_map)} has type "
                f"{describe_type(arrow_type)}; expected a 3-D image [C, H, W] or [H, W, C] "
                "for uint8 observations. Fix: write images with "
                "pyarrow.FixedShapeTensorArray.from_numpy_ndarray(images) from uint8 "
                "[rows, C, H, W] (or [rows, H, W, C] with observation_layout 'HWC' in "
                "dataset.json), or store other observations as float32"
            )
    for column in CANONICAL_COLUMNS:
        if column in types and not _type_ok(column, types[column]):
            expected, fix = _EXPECTED[column]
            raise DatasetError(
                f"{path}: column {column_label(column, column_map)} has type "
                f"{describe_type(types[column])}; expected {expected}. Fix: {fix}"
            )
    return types


def _maybe_null(
    metadata: pq.FileMetaData, schema: pa.Schema, column_map: Mapping[str, str]
) -> tuple[str, ...]:
    """Canonical columns that some row group's statistics do not clear of nulls.

    A tensor column is stored as one leaf column whose null count covers both null rows and
    null elements, so zero there means no null anywhere in the column.
    """
    renamed_from = {on_disk: canonical for canonical, on_disk in column_map.items()}
    # Leaf paths are "name" or "name.list.element"; match the longest top-level name first,
    # so a name that itself contains a dot is found whole.
    names = sorted(schema.names, key=len, reverse=True)
    top_of = {}
    for leaf in range(metadata.num_columns):
        path = metadata.schema.column(leaf).path
        top_of[leaf] = next(n for n in names if path == n or path.startswith(n + "."))
    suspect = set()
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        for leaf, top in top_of.items():
            if top in suspect:
                continue
            stats = row_group.column(leaf).statistics
            if stats is None or not stats.has_null_count or stats.null_count:
                suspect.add(top)
    canonical = [renamed_from.get(n, n) for n in schema.names if n in suspect]
    return tuple(c for c in canonical if c in CANONICAL_COLUMNS)


def _null_rows(values: pa.ChunkedArray) -> int:
    """Rows that are null or, for tensors, hold a null element."""
    rows = 0
    for chunk in values.chunks:
        if isinstance(chunk, pa.ExtensionArray):
            chunk = chunk.storage
        missing = chunk.is_null().to_numpy(zero_copy_only=False)
        if pa.types.is_fixed_size_list(chunk.type) and chunk.type.list_size:
            size = chunk.type.list_size
            elements = chunk.values.slice(chunk.offset * size, len(chunk) * size)
            missing |= elements.is_null().to_numpy(zero_copy_only=False).reshape(-1, size).any(1)
        rows += int(missing.sum())
    return rows


def _type_ok(column: str, arrow_type: pa.DataType) -> bool:
    if column == "eps_id":
        return arrow_type in _STRINGS or pa.types.is_int64(arrow_type)
    if column == "t":
        return pa.types.is_int32(arrow_type) or pa.types.is_int64(arrow_type)
    if column in ("obs", "new_obs"):
        return _observation_shape(arrow_type) is not None
    if column == "actions":
        return pa.types.is_int64(arrow_type) or _tensor_shape(arrow_type) is not None
    if column == "rewards":
        return pa.types.is_float32(arrow_type)
    if column in ("terminateds", "truncateds"):
        return pa.types.is_boolean(arrow_type)
    if pa.types.is_dictionary(arrow_type):
        return arrow_type.value_type in _STRINGS
    return arrow_type in _STRINGS


def _tensor_shape(arrow_type: pa.DataType) -> tuple[int, ...] | None:
    """Shape of one element of a float32 tensor column; None for anything else."""
    if isinstance(arrow_type, pa.FixedShapeTensorType):
        if pa.types.is_float32(arrow_type.value_type) and arrow_type.shape:
            return tuple(arrow_type.shape)
        return None
    if pa.types.is_fixed_size_list(arrow_type) and pa.types.is_float32(arrow_type.value_type):
        return (arrow_type.list_size,)
    return None


def _observation_shape(arrow_type: pa.DataType) -> tuple[int, ...] | None:
    """Shape of one observation: a float32 tensor or a uint8 image; None for anything else."""
    if is_image(arrow_type):
        return tuple(arrow_type.shape)
    return _tensor_shape(arrow_type)


def _uint8_tensor(arrow_type: pa.DataType | None) -> bool:
    if isinstance(arrow_type, pa.FixedShapeTensorType | pa.FixedSizeListType):
        return pa.types.is_uint8(arrow_type.value_type)
    return False


def _same_columns(first: FileFacts, other: FileFacts, column_map: Mapping[str, str]) -> None:
    missing = [c for c in first.types if c not in other.types]
    extra = [c for c in other.types if c not in first.types]
    if missing or extra:
        found = "; ".join(
            part
            for part in (
                f"missing {', '.join(map(repr, missing))}" if missing else "",
                f"extra {', '.join(map(repr, extra))}" if extra else "",
            )
            if part
        )
        raise DatasetError(
            f"{other.path}: columns differ from {first.path} ({found}); expected every file "
            "to have the same columns"
        )
    for column, arrow_type in first.types.items():
        other_type = other.types[column]
        if column in ("obs", "new_obs", "actions"):
            shape, other_shape = _tensor_shape(arrow_type), _tensor_shape(other_type)
            if shape is not None and other_shape is not None and shape != other_shape:
                raise DatasetError(
                    f"{other.path}: column {column_label(column, column_map)} has shape "
                    f"{list(other_shape)} but {first.path} has {list(shape)}; expected one "
                    "shape across all files"
                )
        if other_type != arrow_type:
            raise DatasetError(
                f"{other.path}: column {column_label(column, column_map)} has type "
                f"{describe_type(other_type)} but {first.path} has {describe_type(arrow_type)}; "
                "expected one type per column across all files. Fix: rewrite the file with "
                "the type the others use"
            )


def column_label(column: str, column_map: Mapping[str, str]) -> str:
    """A canonical column in messages, with its name on disk when the column map renames it."""
    if column in column_map:
        return f"{column!r} (on disk {column_map[column]!r})"
    return repr(column)
