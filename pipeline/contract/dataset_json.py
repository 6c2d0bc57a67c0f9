"""``dataset.json``: the description that travels next to a dataset's Parquet files.

Every field but ``id`` is optional, so a hand-written file can say as much as its author
knows; whatever it does say must agree with the files (checked by ``check_metadata``).
Unknown fields are refused, so that a misspelt ``num_row`` cannot silently skip a check.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pyarrow.fs as pafs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipeline.contract.schema import DatasetError, EpisodeSchema, ObservationLayout
from pipeline.io.dataset_source import METADATA_FILE, ResolvedSource


class Space(BaseModel):
    """An observation or action space, in the Gymnasium sense."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["box", "discrete"]
    """``box``: float32 tensors of ``shape``; ``discrete``: int64 indices in ``[0, n)``."""
    shape: tuple[int, ...] = ()
    """Shape of one element; ``()`` for discrete spaces."""
    low: float | None = None
    """Lower bound of every component of a box, when bounded."""
    high: float | None = None
    """Upper bound of every component of a box, when bounded."""
    n: int | None = None
    """Number of discrete actions."""

    @model_validator(mode="after")
    def _discrete_is_scalar(self) -> Space:
        if self.kind == "discrete" and self.shape != ():
            raise ValueError(f"a discrete space has shape (), found {list(self.shape)}")
        return self


class GeneratorInfo(BaseModel):
    """The program and arguments that wrote the dataset, so that it can be rebuilt."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    args: dict[str, Any] = Field(default_factory=dict)


class CompactedFrom(BaseModel):
    """The dataset that ``offmeta data compact`` rewrote into this one."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fingerprint: str
    """The source's fingerprint (see docs/data-contract.md#dataset-json)."""
    files: int
    """How many files the source had."""


class DatasetMetadata(BaseModel):
    """The content of ``dataset.json``."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """Dataset name, e.g. ``"sinusoid"``."""
    version: str = "1"
    """Version of the dataset's definition; bump it when the generator's output changes."""
    split: Literal["train", "heldout"] | None = None
    """Which task set this is: tasks to meta-train on, or tasks kept for evaluation."""
    description: str = ""
    observation_space: Space | None = None
    observation_layout: ObservationLayout | None = None
    """Axis order of uint8 image observations: ``CHW`` (the default for them) or ``HWC``;
    only for datasets whose ``obs`` is a 3-D ``fixed_shape_tensor<uint8>``."""
    action_space: Space | None = None
    tasks: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Parameters of each task, by task id (sinusoid amplitude/phase, point-robot goal)."""
    generator: GeneratorInfo | None = None
    num_rows: int | None = None
    """Total rows of all files; checked when the whole dataset is read."""
    files: list[str] | None = None
    """Data files, relative to the directory of ``dataset.json``, in POSIX form."""
    compacted_from: CompactedFrom | None = None
    """Set by ``offmeta data compact``: the dataset these files were rewritten from."""


def load_metadata(
    resolved: ResolvedSource,
) -> tuple[DatasetMetadata | None, bytes]:
    """Read and parse ``dataset.json`` in the dataset root; ``(None, b"")`` when absent."""
    fs, path = resolved.filesystem, f"{resolved.root.rstrip('/')}/{METADATA_FILE}"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None, b""
    with fs.open_input_stream(path) as stream:
        raw = stream.read()
    try:
        document = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc}); expected a JSON object") from None
    try:
        return DatasetMetadata.model_validate(document), raw
    except ValidationError as exc:
        problems = "; ".join(
            f"field '{'.'.join(str(p) for p in e['loc']) or '<root>'}': {e['msg']}"
            for e in exc.errors()
        )
        raise DatasetError(
            f"{path}: {problems}; expected the fields of docs/data-contract.md#dataset-json"
        ) from None


def write_metadata(directory: Path, metadata: DatasetMetadata) -> Path:
    """Write ``dataset.json`` with sorted keys, so equal metadata gives equal bytes."""
    path = directory / METADATA_FILE
    document = metadata.model_dump(mode="json", exclude_none=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    return path


def check_metadata(
    metadata: DatasetMetadata,
    resolved: ResolvedSource,
    schema: EpisodeSchema,
    rows_per_file: Mapping[str, int],
) -> None:
    """Refuse a ``dataset.json`` that contradicts the files it sits next to."""
    where = f"{resolved.root.rstrip('/')}/{METADATA_FILE}"
    first = resolved.files[0]
    fix = "fix dataset.json or the files, or regenerate the dataset"
    obs_space, action_space = metadata.observation_space, metadata.action_space
    if obs_space is not None and tuple(obs_space.shape) != schema.obs_shape:
        raise DatasetError(
            f"{where}: observation_space.shape is {list(obs_space.shape)} but column 'obs' "
            f"in {first} has shape {list(schema.obs_shape)}; expected them to agree ({fix})"
        )
    if action_space is not None:
        found_kind = "discrete" if schema.discrete_actions else "box"
        if action_space.kind != found_kind:
            found = "int64 (discrete)" if schema.discrete_actions else "float32 tensors (box)"
            raise DatasetError(
                f"{where}: action_space.kind is '{action_space.kind}' but column 'actions' in "
                f"{first} holds {found}; expected them to agree ({fix})"
            )
        if tuple(action_space.shape) != schema.action_shape:
            raise DatasetError(
                f"{where}: action_space.shape is {list(action_space.shape)} but column "
                f"'actions' in {first} has shape {list(schema.action_shape)}; "
                f"expected them to agree ({fix})"
            )
    selected = [resolved.relative(f) for f in resolved.files]
    if metadata.files is not None:
        recorded = set(metadata.files)
        unlisted = [f for f in selected if f not in recorded]
        if unlisted:
            raise DatasetError(
                f"{where}: file '{unlisted[0]}' is not listed in 'files' "
                f"({len(metadata.files)} files listed); expected only listed files ({fix})"
            )
        absent = sorted(recorded - set(selected))
        if resolved.whole_directory and absent:
            raise DatasetError(
                f"{where}: 'files' lists '{absent[0]}' but it is not in {resolved.root}; "
                f"expected every listed file to exist ({fix})"
            )
    complete = resolved.whole_directory or (
        metadata.files is not None and set(metadata.files) == set(selected)
    )
    total = sum(rows_per_file.values())
    if complete and metadata.num_rows is not None and metadata.num_rows != total:
        raise DatasetError(
            f"{where}: num_rows is {metadata.num_rows} but the {len(rows_per_file)} file(s) "
            f"hold {total} rows; expected them to agree ({fix})"
        )


def with_observation_layout(
    metadata: DatasetMetadata | None, resolved: ResolvedSource, schema: EpisodeSchema
) -> EpisodeSchema:
    """``schema`` with the image layout ``dataset.json`` declares (``CHW`` when it declares
    none); refuse a layout declared for observations that are not uint8 images."""
    declared = None if metadata is None else metadata.observation_layout
    if declared is None:
        return schema
    if schema.obs_layout is None:
        where = f"{resolved.root.rstrip('/')}/{METADATA_FILE}"
        raise DatasetError(
            f"{where}: observation_layout is '{declared}' but column 'obs' in "
            f"{resolved.files[0]} holds float32 observations of shape {list(schema.obs_shape)}; "
            "expected observation_layout only for uint8 image observations (remove it from "
            "dataset.json, or store the images as fixed_shape_tensor<uint8>)"
        )
    return dataclasses.replace(schema, obs_layout=declared)


def check_task_ids(
    metadata: DatasetMetadata, resolved: ResolvedSource, task_ids: tuple[str, ...]
) -> None:
    """Every task in the data must be described when ``dataset.json`` describes tasks."""
    if not metadata.tasks:
        return
    unknown = [t for t in task_ids if t not in metadata.tasks]
    if unknown:
        where = f"{resolved.root.rstrip('/')}/{METADATA_FILE}"
        raise DatasetError(
            f"{where}: task '{unknown[0]}' occurs in column 'task_id' ({len(unknown)} such "
            f"task(s)) but is not described in 'tasks'; expected every task id to have "
            "an entry (fix dataset.json or the files, or regenerate the dataset)"
        )
