"""The records the store writes: version manifests, lineage, aliases, and references.

A manifest is immutable once published; everything a consumer needs to find, check
and interpret a version is in it: the digest and size of every file, the shape and
digest of every tensor, metrics, the run config and where the result came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, field_validator

from pipeline.artifacts.content.digest import PARAMS_FILE
from pipeline.artifacts.errors import ArtifactError

SCHEMA_VERSION = 1
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


@dataclass(frozen=True)
class ArtifactRef:
    """A concrete version: ``str(ref)`` is ``"name:version"``.

    ``digest`` is the params digest; ``uri`` locates the manifest (``file://`` for a local
    store, ``s3://`` for object storage).
    """

    name: str
    version: int
    digest: str
    uri: str

    def __str__(self) -> str:
        return f"{self.name}:{self.version}"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FileEntry(_Record):
    """One file of a version, stored as the blob named by its digest."""

    digest: Digest
    """``sha256:<hex>`` of the raw bytes, or for the params file the tensor digest."""
    size: int = Field(ge=0)
    """Size of the stored blob in bytes."""
    media_type: str
    """``application/json``, ``image/png``, ``application/vnd.safetensors``, ..."""
    digest_of: Literal["bytes", "tensors"] = "bytes"
    """What ``digest`` covers: the file's bytes, or the tensors in a safetensors file."""


class TensorEntry(_Record):
    """One parameter tensor in the params file."""

    dtype: str
    """safetensors dtype code (``F32``, ``BF16``, ``I64``, ...)."""
    shape: tuple[int, ...]
    digest: Digest
    """sha256 of the tensor's raw little-endian bytes."""


class Lineage(_Record):
    """Where a version came from. Every field is optional; record what the run knows."""

    dataset_fingerprint: str | None = None
    """``Episodes.fingerprint`` of the training data."""
    parent: str | None = None
    """The version this one was warm-started from; publish stores any reference to it
    (``ArtifactRef``, ``"name@latest"``) as the concrete ``"name:17"``."""
    flow_run_id: str | None = None
    """Prefect flow run that produced the version: the run the user (or a schedule)
    triggered, which is the top-level one when the training flow ran as a subflow."""
    subflow_run_id: str | None = None
    """The flow run that trained and published, when it is a subflow of ``flow_run_id``
    (a deployment's ``meta-train-from-file`` run calls ``meta-train``); None otherwise."""
    code_version: str | None = None
    """Version of the code that trained it (package version, git commit)."""
    weights_seq_no: int | None = None
    """The learner's weights sequence number when the parameters were taken."""
    extras: dict[str, JsonValue] = Field(default_factory=dict)
    """Free-form facts, e.g. ``{"restarts": 2}``."""

    @field_validator("parent", mode="before")
    @classmethod
    def _ref_as_text(cls, value: object) -> object:
        # Lineage(parent=ref) reads naturally; the manifest stores "name:version".
        return str(value) if isinstance(value, ArtifactRef) else value


class Manifest(_Record):
    """One immutable version of an artifact."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    version: int = Field(ge=1)
    created_at: AwareDatetime
    idempotency_key: str | None = None
    metrics: dict[str, JsonValue]
    config: dict[str, JsonValue]
    lineage: Lineage
    modules: tuple[str, ...]
    """Module ids in the params file, including modules without parameters."""
    tensors: dict[str, TensorEntry]
    """``"module_id/param_name"`` -> dtype, shape and digest."""
    files: dict[str, FileEntry]
    """File name -> blob; always holds params.safetensors, metrics.json and config.json."""

    @property
    def spec(self) -> str:
        """``"name:version"``, the string ``ArtifactStore.resolve`` accepts."""
        return f"{self.name}:{self.version}"

    @property
    def params_digest(self) -> str:
        return self.files[PARAMS_FILE].digest


class AliasRecord(_Record):
    """Contents of ``aliases/<alias>.json``."""

    name: str
    alias: str
    version: int = Field(ge=1)
    previous: int | None = None
    updated_at: datetime


class KeyRecord(_Record):
    """Contents of ``keys/<sha256(idempotency key)>.json``."""

    idempotency_key: str
    version: int = Field(ge=1)


def json_safe(value: object, what: str) -> Any:
    """Return ``value`` as plain JSON data, or raise naming the first offending entry.

    Scalars with ``.item()`` (numpy scalars, one-element tensors of any rank 0) are
    unwrapped. NaN and infinities are refused because JSON cannot represent them.
    """
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArtifactError(
                f"{what} is {value}; JSON cannot hold NaN or infinity "
                f"(drop it or record it as a string)"
            )
        return value
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        return json_safe(value.item(), what)
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ArtifactError(f"{what} has the key {key!r}; JSON object keys are strings")
            result[key] = json_safe(item, f"{what}[{key!r}]")
        return result
    if isinstance(value, list | tuple):
        return [json_safe(item, f"{what}[{index}]") for index, item in enumerate(value)]
    hint = " (call .item() or .tolist() first)" if hasattr(value, "tolist") else ""
    raise ArtifactError(f"{what} is a {type(value).__name__}, which is not JSON data{hint}")
