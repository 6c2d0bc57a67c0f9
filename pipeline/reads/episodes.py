"""Read an episode dataset: check it, fingerprint it, count it, then hand it to Ray Data.

``inspect_episodes`` does everything that needs no Ray (footer checks, nulls,
``dataset.json``, episode structure across files, values, fingerprint, episode/task/module
counts); ``read_episodes`` adds the Ray Dataset, built only from files that passed. Columns
arrive in canonical names and canonical types: observations and float actions as
``fixed_shape_tensor`` (so numpy batches are float32 ``[B, *shape]`` arrays, never object
arrays) and ``t`` as int32.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.contract.dataset_json import (
    check_metadata,
    check_task_ids,
    load_metadata,
    with_observation_layout,
)
from pipeline.contract.footer_checks import (
    build_schema,
    check_column_map,
    check_nulls,
    read_footers,
)
from pipeline.contract.id_checks import check_episodes
from pipeline.contract.id_findings import VALIDATION_MEMORY_MB
from pipeline.contract.integer_range import check_step_range, with_step_type
from pipeline.contract.schema import CheckValues, EpisodeSchema
from pipeline.contract.value_checks import ValueFacts, check_value_columns
from pipeline.io.dataset_source import METADATA_FILE, ResolvedSource, Source, resolve_source, uri_of
from pipeline.io.parquet_files import map_files
from pipeline.reads.ray_logging import quiet_ray
from pipeline.reads.selection import EpisodeFilter, EpisodeSelection, select_episodes

if TYPE_CHECKING:
    import ray.data

_HASH_CHUNK = 1 << 20


@dataclass(frozen=True)
class DatasetInfo:
    """Everything established about a dataset without Ray."""

    schema: EpisodeSchema
    metadata: dict[str, Any]
    """``dataset.json`` as parsed JSON; ``{}`` when the dataset has none."""
    fingerprint: str
    """sha256 hex digest of the files and ``dataset.json`` (docs/data-contract.md#fingerprint)."""
    files: tuple[str, ...]
    """Sorted paths on ``filesystem``."""
    file_sizes: tuple[int, ...]
    """Bytes on disk of each of ``files``, as validated and fingerprinted."""
    file_rows: tuple[int, ...]
    """Rows of each of ``files``, from their footers."""
    num_rows: int
    num_episodes: int
    """Distinct ``eps_id`` values."""
    task_ids: tuple[str, ...]
    """Sorted distinct task ids; ``(DEFAULT_TASK_ID,)`` without a ``task_id`` column."""
    module_ids: tuple[str, ...]
    """Sorted distinct module ids; ``(DEFAULT_MODULE_ID,)`` without a ``module_id`` column."""
    root: str
    """Directory of ``dataset.json`` (the common directory of the files)."""
    filesystem: pafs.FileSystem = field(repr=False, compare=False)
    needs_normalising: bool = field(repr=False)
    """Some column is stored in a non-canonical type (``fixed_size_list`` tensors, int64
    ``t``) that reads convert; known from the footers, so reads open no file to decide."""
    values: ValueFacts = field(repr=False)
    """What the value checks covered, and float actions outside a declared box."""
    selection: EpisodeSelection | None = field(default=None, repr=False, kw_only=True)
    """The episodes ``episodes_where`` keeps (every read keeps only their rows); ``None``:
    every episode (``pipeline.reads.selection``)."""

    def summary(self) -> dict[str, Any]:
        """Plain-JSON description for logs, the CLI and artifact lineage; the count of float
        actions outside a declared box only when there are some."""
        summary = {
            "id": self.metadata.get("id"),
            "split": self.metadata.get("split"),
            "root": uri_of(self.filesystem, self.root),
            "files": len(self.files),
            "rows": self.num_rows,
            "episodes": self.num_episodes,
            "tasks": len(self.task_ids),
            "modules": list(self.module_ids),
            "obs_shape": list(self.schema.obs_shape),
            "action_shape": list(self.schema.action_shape),
            "discrete_actions": self.schema.discrete_actions,
            "fingerprint": self.fingerprint,
        }
        if self.schema.obs_layout is not None:
            summary["observation_layout"] = self.schema.obs_layout
        if self.values.actions_outside_box:
            summary["actions_outside_box"] = self.values.actions_outside_box
        if self.selection is not None:
            summary["episodes_where"] = self.selection.summary()
        return summary


@dataclass(frozen=True)
class Episodes(DatasetInfo):
    """A validated dataset and its Ray Dataset, in canonical column names."""

    dataset: ray.data.Dataset = field(repr=False, compare=False)


def inspect_episodes(
    source: Source,
    *,
    column_map: Mapping[str, str] | None = None,
    filesystem: pafs.FileSystem | None = None,
    allow_partial_episodes: bool = False,
    check_values: CheckValues = "full",
    validation_memory_mb: float = VALIDATION_MEMORY_MB,
    episodes_where: EpisodeFilter | None = None,
    normalize: Sequence[str] = (),
    gamma: float = 0.99,
) -> DatasetInfo:
    """Validate a dataset and describe it, reading footers, id columns, value columns and
    file bytes.

    Raises ``DatasetError`` naming the file, the column, what was found and what was
    expected. ``column_map`` maps canonical names to names on disk.
    ``allow_partial_episodes`` accepts episodes that do not start at ``t = 0``, miss steps
    or carry an end flag before their last step (see docs/data-contract.md#episodes).
    ``check_values`` scans ``obs``, ``new_obs``, ``rewards`` and ``actions`` for NaN, inf
    and actions outside ``dataset.json``'s action space in every row group (``full``), in
    one in 16 (``sample``), or not at all (``off``): see ``pipeline.contract.value_checks``.
    Float actions outside a declared box are not refused: ``values.warning`` says how many,
    for the caller to show (``offmeta data validate`` prints it), and ``summary()`` counts them.
    ``validation_memory_mb`` bounds the id checks' memory: above it they sort the ids on disk
    (``pipeline.contract.id_checks``). ``episodes_where`` selects episodes by their
    columns (``pipeline.reads.selection``): ``selection`` says which, and every read keeps
    only their rows. ``normalize`` names float columns whose per-feature statistics the
    value checks gather on the way (``values.stats``; over the episodes kept), and
    ``returns``, the return-to-go at discount ``gamma`` of the rewards they read.
    """
    mapping = check_column_map(column_map)
    resolved = resolve_source(source, filesystem)
    metadata, metadata_bytes = load_metadata(resolved)
    facts = read_footers(resolved, mapping)
    schema = with_observation_layout(metadata, resolved, build_schema(resolved, facts, mapping))
    check_nulls(resolved, facts, mapping)
    check_step_range(resolved, facts, mapping)
    rows_per_file = {f.path: f.num_rows for f in facts}
    if metadata is not None:
        check_metadata(metadata, resolved, schema, rows_per_file)
    ids = check_episodes(
        resolved,
        schema,
        num_rows=sum(rows_per_file.values()),
        allow_partial_episodes=allow_partial_episodes,
        memory_mb=validation_memory_mb,
    )
    if metadata is not None:
        check_task_ids(metadata, resolved, ids.task_ids)
    action_space = None if metadata is None else metadata.action_space
    selection = None
    if episodes_where is not None:
        selection = select_episodes(resolved, facts[0].types, schema, episodes_where)
    kept = None if selection is None else selection.kept
    values = check_value_columns(
        resolved, facts, schema, action_space, check_values, normalize, kept, gamma
    )
    fingerprint, sizes = _fingerprint(resolved, metadata_bytes)
    return DatasetInfo(
        schema=schema,
        metadata=_json_document(metadata_bytes),
        fingerprint=fingerprint,
        files=resolved.files,
        file_sizes=sizes,
        file_rows=tuple(rows_per_file[path] for path in resolved.files),
        num_rows=sum(rows_per_file.values()),
        num_episodes=ids.num_episodes,
        task_ids=ids.task_ids,
        module_ids=ids.module_ids,
        root=resolved.root,
        filesystem=resolved.filesystem,
        needs_normalising=_needs_normalising(facts[0].types),
        values=values,
        selection=selection,
    )


def read_episodes(
    source: Source,
    *,
    column_map: Mapping[str, str] | None = None,
    filesystem: pafs.FileSystem | None = None,
    allow_partial_episodes: bool = False,
    check_values: CheckValues = "full",
    validation_memory_mb: float = VALIDATION_MEMORY_MB,
    episodes_where: EpisodeFilter | None = None,
    normalize: Sequence[str] = (),
    gamma: float = 0.99,
    validated: DatasetInfo | None = None,
) -> Episodes:
    """Validate a dataset (see ``inspect_episodes``), then read it with Ray Data.

    ``validated``: what ``inspect_episodes`` found for this ``source`` with these options,
    when the caller has just run it (its checks are then not run again).

    The Ray Dataset reads exactly the validated files, in groups of files per read task
    (``pipeline.reads.file_groups``), renames columns to their canonical names and normalises
    types; it starts Ray (or joins the running session) on first use. Ray's INFO output is
    silenced unless ``OFFMETA_VERBOSE=1`` (``pipeline.reads.ray_logging``).
    """
    from pipeline.reads.file_groups import read_grouped

    quiet_ray()
    info = validated or inspect_episodes(
        source,
        column_map=column_map,
        filesystem=filesystem,
        allow_partial_episodes=allow_partial_episodes,
        check_values=check_values,
        validation_memory_mb=validation_memory_mb,
        episodes_where=episodes_where,
        normalize=normalize,
        gamma=gamma,
    )
    dataset = read_grouped(info.files, info.file_sizes, info.file_rows, info.filesystem)
    fields = {name: getattr(info, name) for name in DatasetInfo.__dataclass_fields__}
    return Episodes(**fields, dataset=to_canonical(info, dataset))


def to_canonical(info: DatasetInfo, dataset: ray.data.Dataset) -> ray.data.Dataset:
    """``dataset``, a Ray read of ``info``'s validated files, with the canonical column
    names and types: the one place that renames and converts, for ``read_episodes`` and
    for the streams' per-epoch reads (``canonical_table`` does the same to one table)."""
    renames = {on_disk: canonical for canonical, on_disk in info.schema.column_map.items()}
    if renames:
        dataset = dataset.rename_columns(renames)
    if info.needs_normalising:
        dataset = dataset.map_batches(
            _normalise_batch,
            fn_kwargs={"where": info.root},
            batch_format="pyarrow",
            batch_size=None,
            zero_copy_batch=True,
        )
    if info.selection is not None:
        from ray.data.expressions import col

        dataset = dataset.filter(expr=col("eps_id").is_in(info.selection.kept.to_pylist()))
    return dataset


def canonical_table(info: DatasetInfo, table: pa.Table) -> pa.Table:
    """``table``, read from one of ``info``'s validated files, with the canonical column
    names and types (as ``to_canonical`` gives them in a Ray Dataset), and, with a
    selection, only the rows of the episodes it keeps (``table`` then has ``eps_id``)."""
    renames = {on_disk: canonical for canonical, on_disk in info.schema.column_map.items()}
    if renames:
        table = table.rename_columns([renames.get(name, name) for name in table.column_names])
    table = _normalise_batch(table, info.root) if info.needs_normalising else table
    selection = getattr(info, "selection", None)
    return table if selection is None else selection.keep(table)


def _needs_normalising(types: Mapping[str, pa.DataType]) -> bool:
    """Whether reads must convert types (every file has the same types: validated)."""
    tensors = [types[c] for c in ("obs", "new_obs", "actions") if c in types]
    return pa.types.is_int64(types["t"]) or any(pa.types.is_fixed_size_list(t) for t in tensors)


def _normalise_batch(batch: pa.Table, where: str) -> pa.Table:
    """Zero-copy ``fixed_size_list`` -> ``fixed_shape_tensor`` (numpy batches of the former
    are object arrays), and ``t`` int64 -> int32 (validated to fit; ``where``: the files'
    directory, named if a file changed since)."""
    for name in ("obs", "new_obs", "actions"):
        if name not in batch.column_names:
            continue
        if pa.types.is_fixed_size_list(batch.schema.field(name).type):
            column = batch.column(name).combine_chunks()
            tensor_type = pa.fixed_shape_tensor(column.type.value_type, [column.type.list_size])
            tensor = pa.ExtensionArray.from_storage(tensor_type, column)
            batch = batch.set_column(batch.schema.get_field_index(name), name, tensor)
    return with_step_type(batch, where=where)


def _fingerprint(resolved: ResolvedSource, metadata_bytes: bytes) -> tuple[str, tuple[int, ...]]:
    """sha256 over the sorted ``relative path, size, sha256 of the bytes`` lines of every
    file, then ``dataset.json``'s bytes: any changed byte changes it, renames too. Also
    each file's size, in the order of ``resolved.files``."""
    hashed = map_files(functools.partial(_file_digest, resolved.filesystem), resolved.files)
    entries = [
        (resolved.relative(path), size, digest)
        for path, (size, digest) in zip(resolved.files, hashed, strict=True)
    ]
    total = hashlib.sha256()
    for relative, size, digest in sorted(entries):
        total.update(f"{relative}\t{size}\t{digest}\n".encode())
    if metadata_bytes:
        total.update(f"{METADATA_FILE}\t{len(metadata_bytes)}\t".encode() + metadata_bytes)
    return total.hexdigest(), tuple(size for size, _ in hashed)


def _file_digest(filesystem: pafs.FileSystem, path: str) -> tuple[int, str]:
    """Size and sha256 hex digest of one file's bytes."""
    digest, size = hashlib.sha256(), 0
    with filesystem.open_input_stream(path) as stream:
        while chunk := stream.read(_HASH_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _json_document(raw: bytes) -> dict[str, Any]:
    return json.loads(raw) if raw else {}
