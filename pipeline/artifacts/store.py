"""``ArtifactStore``: publish immutable, numbered versions and read them back, verified.

Publishing, in order (see README "Artifact store" for the layout):
1. validate everything (names, params, JSON-ability of metrics/config/lineage);
2. write every blob (params, metrics.json, config.json, history and learning curve,
   attached files) under its digest, holding the root's gc lock *shared*;
3. take the artifact's exclusive ``flock`` and, while holding it: return the existing
   version if the idempotency key is known, otherwise number the version max+1, stage
   the manifest, record the key, ``os.link`` the manifest into ``versions/`` and move
   ``latest`` forward; then release.

A version exists exactly when its manifest is linked, and a manifest is linked only
after everything it refers to is durable, so a publisher that dies anywhere leaves no
partial version (at worst ``latest`` lags until the next publish); the number
it would have taken is still free (numbers stay gap-free), and its staged files and
blobs are garbage for ``gc``. The lock is an ``flock``, released by the kernel when its
holder dies, and held only around the few small writes of step 3. Readers take no lock:
manifests never change once linked and aliases are replaced atomically.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from pipeline.artifacts import fsio
from pipeline.artifacts.blobs import BlobWriter, media_type
from pipeline.artifacts.cleanup import GcReport, collect_garbage
from pipeline.artifacts.digest import PARAMS_FILE, EncodedParams, flatten_params
from pipeline.artifacts.errors import (
    AliasConflictError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
)
from pipeline.artifacts.layout import Layout
from pipeline.artifacts.manifest import (
    AliasRecord,
    ArtifactRef,
    FileEntry,
    KeyRecord,
    Lineage,
    Manifest,
    TensorEntry,
    json_safe,
)
from pipeline.artifacts.names import parse_version, validate_name
from pipeline.artifacts.plots import check_history, learning_curve_files
from pipeline.artifacts.reader import Reader
from pipeline.artifacts.reader import read_manifest as _read_manifest
from pipeline.artifacts.roots import local_root

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
    """A versioned artifact registry in a local directory (created on first write).

    ``root`` is a path or a ``file://`` URI (``pipeline.artifacts.roots``); a root with any
    other scheme, such as ``s3://``, raises UnsupportedRootError.

    ``durable=False`` skips fsync (for scratch stores and tests; a power loss may then
    lose recent versions, never corrupt older ones). ``lock_timeout`` bounds every wait
    for another process's lock.
    """

    def __init__(
        self, root: str | os.PathLike[str], *, durable: bool = True, lock_timeout: float = 60.0
    ) -> None:
        super().__init__(Layout(local_root(root)))
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

        ``on_stage``, when given, is called with ``"blobs-written"`` (every blob durable, no
        lock taken yet) and ``"manifest-staged"`` (the number claimed under the lock, the
        manifest staged but not linked): the two points where a publisher that dies must
        leave no partial version. It only observes (progress, or a crash test stopping the
        process there to kill it); what it returns is ignored.
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

        with self._gc_shared():
            stored, encoded = self._write_blobs(
                name, (modules, flat), metrics_data, config_data, history_data, extras
            )
            if on_stage is not None:
                on_stage("blobs-written")

            with fsio.file_lock(self._layout.lock(name), timeout=self.lock_timeout):
                if idempotency_key is not None and (found := self._by_key(name, idempotency_key)):
                    return self._ref(found)
                numbers = self._layout.version_numbers(name)
                manifest = Manifest(
                    name=name,
                    version=(numbers[-1] if numbers else 0) + 1,
                    created_at=datetime.now(UTC),
                    idempotency_key=idempotency_key,
                    metrics=metrics_data,
                    config=config_data,
                    lineage=lineage_record,
                    modules=encoded.modules,
                    tensors={
                        key: TensorEntry(dtype=t.dtype, shape=t.shape, digest=t.digest)
                        for key, t in encoded.tensors.items()
                    },
                    files=stored,
                )
                self._commit_manifest(manifest, on_stage)
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
        """Every file of the new version as a durable blob, keyed by its file name."""
        writer = BlobWriter(self._layout, durable=self.durable)
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
        writer.sync()
        return stored, encoded

    def _commit_manifest(self, manifest: Manifest, on_stage: Callable[[str], None] | None) -> None:
        """Make ``manifest`` visible; the caller holds the artifact lock."""
        layout, name = self._layout, manifest.name
        staged = fsio.write_temp(
            layout.tmp, manifest.model_dump_json(indent=2).encode(), durable=self.durable
        )
        try:
            if manifest.idempotency_key is not None:
                # Recorded before the manifest exists: a crash in between leaves a record
                # whose version is missing or carries another key, which _by_key ignores.
                record = KeyRecord(
                    idempotency_key=manifest.idempotency_key, version=manifest.version
                )
                self._replace(layout.key(name, manifest.idempotency_key), record.model_dump_json())
            if on_stage is not None:
                on_stage("manifest-staged")
            final = layout.manifest(name, manifest.version)
            if not fsio.link_new(staged, final):
                raise ArtifactError(
                    f"{final} already exists although this process holds {layout.lock(name)}: "
                    f"something wrote into the store without taking its lock"
                )
            if self.durable:
                fsio.fsync_dir(final.parent)
        finally:
            fsio.remove_quietly(staged)
        previous = self._alias_version(name, "latest")
        if previous is None or previous < manifest.version:
            self._write_alias(name, "latest", manifest.version, previous)

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
        with (
            self._gc_shared(),
            fsio.file_lock(self._layout.lock(name), timeout=self.lock_timeout),
        ):
            self.get(name, version=version)
            current = self._alias_version(name, alias)
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
            if current != version:
                self._write_alias(name, alias, version, current)

    def _write_alias(self, name: str, alias: str, version: int, previous: int | None) -> None:
        record = AliasRecord(
            name=name,
            alias=alias,
            version=version,
            previous=previous,
            updated_at=datetime.now(UTC),
        )
        self._replace(self._layout.alias(name, alias), record.model_dump_json(indent=2))

    def _replace(self, final: Path, text: str) -> None:
        staged = fsio.write_temp(self._layout.tmp, text.encode(), durable=self.durable)
        try:
            fsio.replace(staged, final, durable=self.durable)
        finally:
            fsio.remove_quietly(staged)

    # ------------------------------------------------------------------- cleanup

    def gc(self) -> GcReport:
        """Remove leftovers of interrupted publishes (see ``pipeline.artifacts.cleanup``).

        Waits for in-flight publishes and alias changes to finish; versions, aliases
        and every blob a manifest refers to are kept.
        """
        return collect_garbage(self._layout, timeout=self.lock_timeout)

    # ------------------------------------------------------------------- helpers

    def _gc_shared(self) -> contextlib.AbstractContextManager[None]:
        return fsio.file_lock(self._layout.gc_lock, shared=True, timeout=self.lock_timeout)

    def _by_key(self, name: str, idempotency_key: str) -> Manifest | None:
        path = self._layout.key(name, idempotency_key)
        try:
            record = KeyRecord.model_validate_json(path.read_bytes())
        except (FileNotFoundError, ValidationError):
            return None
        try:
            manifest = _read_manifest(self._layout, name, record.version)
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
