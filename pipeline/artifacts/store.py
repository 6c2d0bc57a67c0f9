"""``ArtifactStore``: publish immutable, numbered versions and read them back, verified.

One protocol over every storage backend (a local directory, S3; see
``pipeline.artifacts.backends``). Publishing, in order:
1. validate everything (names, params, JSON-ability of metrics/config/lineage);
2. write every blob (params, metrics.json, config.json, history and learning curve,
   attached files) under its digest; nothing refers to them yet;
3. with an idempotency key, claim the key (``Backend.claim``) and return the version it
   already published, if any;
4. choose the number after the highest published version, record it for the key, and
   create the manifest with ``put_if_absent``; when another publisher created that
   number first, take the next one and try again;
5. move ``latest`` forward by compare-and-swap (never backwards).

A version exists exactly when its manifest exists, and a manifest is created only after
everything it refers to is stored, so a publisher that dies anywhere leaves no partial
version (at worst ``latest`` lags until the next publish). Numbers stay gap-free: a
number is only ever tried right after one that exists, and a dead publisher's number is
still free. Readers take no lock: manifests never change once created and aliases are
replaced atomically.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from pipeline.artifacts.backends.base import Backend, Lease
from pipeline.artifacts.backends.opening import open_backend
from pipeline.artifacts.cleanup import GcReport, collect_garbage
from pipeline.artifacts.content.blobs import BlobWriter, media_type
from pipeline.artifacts.content.digest import PARAMS_FILE, EncodedParams, flatten_params
from pipeline.artifacts.errors import (
    AliasConflictError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
)
from pipeline.artifacts.plots import check_history, learning_curve_files
from pipeline.artifacts.reader import Reader, alias_record, read_manifest, version_numbers
from pipeline.artifacts.records import layout
from pipeline.artifacts.records.manifest import (
    AliasRecord,
    ArtifactRef,
    FileEntry,
    KeyRecord,
    Lineage,
    Manifest,
    TensorEntry,
    json_safe,
)
from pipeline.artifacts.records.names import parse_version, validate_name

if TYPE_CHECKING:
    import torch

RESERVED_FILES = frozenset(
    {
        PARAMS_FILE,
        "metrics.json",
        "config.json",
        "history.json",
        "learning_curve.png",
        "learning_curve.json",
        "manifest.json",
    }
)
ExtraFile = str | os.PathLike[str] | tuple[str, bytes]


class ArtifactStore(Reader):
    """A versioned artifact registry in a local directory or under ``s3://bucket/prefix``.

    A directory is created on the first write; a bucket must exist. ``durable=False``
    skips fsync in a local store (for scratch stores and tests; a power loss may then
    lose recent versions, never corrupt older ones). ``lock_timeout`` bounds every wait
    for another publisher. ``client`` is a boto3 S3 client to use for an ``s3://`` root
    instead of one configured from the standard AWS environment variables.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        durable: bool = True,
        lock_timeout: float = 60.0,
        client: Any = None,
    ) -> None:
        super().__init__(
            open_backend(root, durable=durable, lock_timeout=lock_timeout, client=client)
        )
        self.durable = durable
        self.lock_timeout = lock_timeout

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r})"

    # ------------------------------------------------------------------- publish

    def publish(
        self,
        name: str,
        params: Mapping[str, Mapping[str, torch.Tensor]],
        *,
        metrics: Mapping[str, Any],
        config: Mapping[str, Any] | Any,
        lineage: Lineage | Mapping[str, Any],
        history: Mapping[str, Any] | None = None,
        files: Iterable[ExtraFile] = (),
        idempotency_key: str | None = None,
        on_stage: Callable[[str], None] | None = None,
    ) -> ArtifactRef:
        """Store a new version of ``name`` and return its reference.

        ``params`` is ``{module_id: {param_name: Tensor}}``. ``config`` is a mapping or a
        pydantic model. ``history`` (``{metric: [values]}``, optionally with an ``iteration``
        series as the x axis) adds history.json, learning_curve.png and learning_curve.json
        (``pipeline.artifacts.plots``). ``files`` attaches paths or ``(file_name, bytes)``
        pairs. A publish whose ``idempotency_key`` was already used for ``name`` returns that
        version unchanged: the first publish under a key wins, later ones are dropped.

        ``on_stage``, when given, is called with ``"blobs-written"`` (every blob stored,
        nothing claimed yet) and ``"manifest-staged"`` (a number chosen and recorded for
        the idempotency key, its manifest not created yet; again for every further number
        tried after losing one to another publisher): the points where a publisher that
        dies must leave no partial version. It only observes (progress, or a crash test
        stopping the process there to kill it); what it returns is ignored.
        """
        validate_name(name)
        if idempotency_key is not None and (
            not isinstance(idempotency_key, str) or not idempotency_key
        ):
            raise ArtifactError(
                f"idempotency_key must be a non-empty string, got {idempotency_key!r}"
            )
        metrics_data = self._mapping(metrics, "metrics")
        config_data = self._mapping(
            config.model_dump(mode="json") if hasattr(config, "model_dump") else config, "config"
        )
        lineage_record = self._lineage(lineage)
        history_data = check_history(history) if history is not None else None
        extras = _extra_files(files)
        modules, flat = flatten_params(params)
        if idempotency_key is not None and (found := self._by_key(name, idempotency_key)):
            return self._ref(found)

        with self._backend.for_writing():
            stored, encoded = self._write_blobs(
                name, (modules, flat), metrics_data, config_data, history_data, extras
            )
            if on_stage is not None:
                on_stage("blobs-written")
            fields = {
                "name": name,
                "idempotency_key": idempotency_key,
                "metrics": metrics_data,
                "config": config_data,
                "lineage": lineage_record,
                "modules": encoded.modules,
                "tensors": {
                    key: TensorEntry(dtype=t.dtype, shape=t.shape, digest=t.digest)
                    for key, t in encoded.tensors.items()
                },
                "files": stored,
            }
            if idempotency_key is None:
                manifest = self._create_manifest(fields, None, on_stage)
            else:
                claim = layout.claim(name, idempotency_key)
                with self._backend.claim(claim, self.lock_timeout) as lease:
                    if found := self._by_key(name, idempotency_key):
                        return self._ref(found)
                    manifest = self._create_manifest(fields, lease, on_stage)
        self._advance_latest(name, manifest.version)
        return self._ref(manifest)

    def _write_blobs(
        self,
        name: str,
        params: tuple[tuple[str, ...], dict[str, torch.Tensor]],
        metrics: dict[str, Any],
        config: dict[str, Any],
        history: dict[str, list[float]] | None,
        extras: list[tuple[str, Path | bytes]],
    ) -> tuple[dict[str, FileEntry], EncodedParams]:
        """Every file of the new version as a stored blob, keyed by its file name."""
        writer = BlobWriter(self._backend)
        params_entry, encoded = writer.put_params(*params)
        stored = {
            PARAMS_FILE: params_entry,
            "metrics.json": writer.put_bytes(_json_bytes(metrics), "application/json"),
            "config.json": writer.put_bytes(_json_bytes(config), "application/json"),
        }
        if history is not None:
            stored["history.json"] = writer.put_bytes(_json_bytes(history), "application/json")
            for file_name, content in learning_curve_files(
                history, f"{name} learning curve"
            ).items():
                stored[file_name] = writer.put_bytes(content, media_type(file_name))
        for file_name, source in extras:
            if isinstance(source, bytes):
                stored[file_name] = writer.put_bytes(source, media_type(file_name))
            else:
                stored[file_name] = writer.put_file(source, media_type(file_name))
        return stored, encoded

    def _create_manifest(
        self,
        fields: dict[str, Any],
        lease: Lease | None,
        on_stage: Callable[[str], None] | None,
    ) -> Manifest:
        """Create the manifest under the first free number after the highest published one.

        With an idempotency key (``lease`` held), the number is recorded for the key
        before the manifest is created: a retry that finds the record and a manifest
        carrying its key returns that version; a record whose manifest never appeared
        (the publisher died) is ignored and overwritten.
        """
        name, idempotency_key = fields["name"], fields["idempotency_key"]
        latest = alias_record(self._backend, name, "latest")[0] or 0
        version = _next_version(self._backend, name, after=latest)
        while True:
            manifest = Manifest(version=version, created_at=datetime.now(UTC), **fields)
            if lease is not None:
                record = KeyRecord(idempotency_key=idempotency_key, version=version)
                key_record = layout.key(name, idempotency_key)
                self._backend.put(key_record, record.model_dump_json().encode())
            if on_stage is not None:
                on_stage("manifest-staged")
            if lease is not None:
                lease.check()
            document = manifest.model_dump_json(indent=2).encode()
            if self._backend.put_if_absent(layout.manifest(name, version), document):
                return manifest
            version = _next_version(self._backend, name, after=version)

    def _advance_latest(self, name: str, version: int) -> None:
        """Move ``latest`` to ``version`` unless it already points at this or a later one."""
        while True:
            current, etag = alias_record(self._backend, name, "latest")
            if current is not None and current >= version:
                return
            if self._backend.swap(
                layout.alias(name, "latest"), _alias_bytes(name, "latest", version, current), etag
            ):
                return

    # ------------------------------------------------------------------- aliases

    def set_alias(self, name: str, alias: str, version: int, *, expected: int | None) -> None:
        """Point ``name@alias`` at ``version`` if it currently points at ``expected``.

        ``expected=None`` means the alias must not exist yet. A stale ``expected`` raises
        AliasConflictError naming the current target; so does moving ``latest`` back.
        """
        validate_name(alias, "alias name")
        version = parse_version(version)
        if expected is not None:
            expected = parse_version(expected)
        self.get(name, version=version)
        while True:
            current, etag = alias_record(self._backend, name, alias)
            if current != expected:
                found = "does not exist" if current is None else f"points at version {current}"
                wanted = "not to exist" if expected is None else f"to point at version {expected}"
                raise AliasConflictError(
                    f"refusing to move {name}@{alias} to version {version}: it {found}, but the "
                    f"caller expected it {wanted}; re-read the alias and retry"
                )
            if alias == "latest" and current is not None and version < current:
                raise AliasConflictError(
                    f"refusing to move {name}@latest back from version {current} to {version}: "
                    f"'latest' only moves forward; use another alias (e.g. 'prod') to pin a version"
                )
            if current == version:
                return
            record = _alias_bytes(name, alias, version, current)
            if self._backend.swap(layout.alias(name, alias), record, etag):
                return
            # Another writer changed the alias after it was read: read it again, which
            # refuses the move unless that writer left it where this caller expected it.

    # ------------------------------------------------------------------- cleanup

    def gc(self, *, older_than: float | None = None) -> GcReport:
        """Remove leftovers of interrupted publishes (see ``pipeline.artifacts.cleanup``).

        Versions, aliases and every blob a manifest refers to are kept. Only leftovers
        last written more than ``older_than`` seconds ago are removed; the default is 0 in
        a local directory (gc waits for in-flight publishes there) and one hour on S3,
        where nothing stops a publisher on another machine from still linking them.
        """
        if older_than is None:
            older_than = self._backend.default_gc_age
        if older_than < 0:
            raise ArtifactError(f"older_than must be >= 0 seconds, got {older_than!r}")
        return collect_garbage(self._backend, older_than=older_than)

    # ------------------------------------------------------------------- helpers

    def _by_key(self, name: str, idempotency_key: str) -> Manifest | None:
        try:
            data = self._backend.read(layout.key(name, idempotency_key))
            record = KeyRecord.model_validate_json(bytes(data))
        except (FileNotFoundError, ValidationError):
            return None
        try:
            manifest = read_manifest(self._backend, name, record.version)
        except ArtifactNotFoundError:
            return None
        return manifest if manifest.idempotency_key == idempotency_key else None

    def _lineage(self, lineage: Lineage | Mapping[str, Any]) -> Lineage:
        if isinstance(lineage, Lineage):
            fields = lineage.model_dump()
        elif isinstance(lineage, Mapping):
            fields = dict(lineage)
        else:
            raise ArtifactError(
                f"lineage must be a Lineage or a dict, got {type(lineage).__name__}"
            )
        parent = fields.get("parent")
        if parent is not None:
            if not isinstance(parent, ArtifactRef | str):
                raise ArtifactError(
                    f"lineage parent must be an ArtifactRef or a string like 'name:17', "
                    f"got {type(parent).__name__}"
                )
            try:
                fields["parent"] = str(self.resolve(str(parent)))
            except ArtifactNotFoundError as exc:
                raise ArtifactError(f"lineage parent {str(parent)!r} not found: {exc}") from None
        if "extras" in fields:
            fields["extras"] = self._mapping(fields["extras"], "lineage extras")
        try:
            return Lineage.model_validate(fields)
        except ValidationError as exc:
            raise ArtifactError(f"lineage is invalid: {exc}") from None

    @staticmethod
    def _mapping(value: object, what: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise ArtifactError(f"{what} must be a dict, got {type(value).__name__}")
        return json_safe(value, what)


def _next_version(backend: Backend, name: str, after: int) -> int:
    """One past the highest published version above ``after`` (``after`` exists or is 0)."""
    numbers = version_numbers(backend, name, after=after)
    return (numbers[-1] if numbers else after) + 1


def _alias_bytes(name: str, alias: str, version: int, previous: int | None) -> bytes:
    record = AliasRecord(
        name=name, alias=alias, version=version, previous=previous, updated_at=datetime.now(UTC)
    )
    return record.model_dump_json(indent=2).encode()


def _json_bytes(data: object) -> bytes:
    return (json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


def _extra_files(files: Iterable[ExtraFile]) -> list[tuple[str, Path | bytes]]:
    if isinstance(files, str | bytes | os.PathLike):
        raise ArtifactError("files must be a list of paths or (file_name, bytes) pairs")
    result: list[tuple[str, Path | bytes]] = []
    seen: set[str] = set()
    for item in files:
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], bytes):
                raise ArtifactError(f"files entry {item!r:.80} must be (file_name, bytes)")
            file_name, source = validate_name(item[0], "file name"), item[1]
        elif isinstance(item, str | os.PathLike):
            source = Path(item)
            if not source.is_file():
                raise ArtifactError(f"files entry {str(source)!r} is not a readable file")
            file_name = validate_name(source.name, "file name")
        else:
            raise ArtifactError(
                f"files entry {item!r:.80} must be a path or a (file_name, bytes) pair"
            )
        if file_name in RESERVED_FILES:
            raise ArtifactNameError(
                f"file name {file_name!r} is reserved for the store's own files "
                f"({', '.join(sorted(RESERVED_FILES))}); rename it"
            )
        if file_name in seen:
            raise ArtifactNameError(f"file name {file_name!r} is attached twice")
        seen.add(file_name)
        result.append((file_name, source))
    return result
