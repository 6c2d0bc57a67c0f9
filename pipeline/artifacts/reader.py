"""The consumer half of the store: find versions, verify them, load and export them.

Nothing here writes to the store or takes a lock: manifests never change once
published and aliases are replaced atomically, so a reader always sees a consistent
version. Every byte handed out (parameters, attached files, exports) is checked against
its manifest digest first.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from pipeline.artifacts.backends.base import Backend
from pipeline.artifacts.content.digest import (
    PARAMS_FILE,
    ParsedParams,
    decode_params,
    describe,
    sha256_hex,
)
from pipeline.artifacts.content.params_blob import receive_params
from pipeline.artifacts.errors import ArtifactNotFoundError, IntegrityError
from pipeline.artifacts.records import layout
from pipeline.artifacts.records.manifest import AliasRecord, ArtifactRef, FileEntry, Manifest
from pipeline.artifacts.records.names import parse_spec, parse_version, validate_name

if TYPE_CHECKING:
    import torch


def read_manifest(backend: Backend, name: str, version: int) -> Manifest:
    """The manifest of ``name:version``; ArtifactNotFoundError if it was never published."""
    key = layout.manifest(name, version)
    try:
        data = backend.read(key)
    except FileNotFoundError:
        numbers = version_numbers(backend, name)
        if not numbers:
            raise ArtifactNotFoundError(
                f"no artifact named {name!r} in {backend.root}{_known(backend)}"
            ) from None
        raise ArtifactNotFoundError(
            f"artifact {name!r} has no version {version} (published: {_ranges(numbers)})"
        ) from None
    where = backend.where(key)
    try:
        manifest = Manifest.model_validate_json(bytes(data))
    except ValidationError as exc:
        raise IntegrityError([f"manifest {where} is not a valid offmeta manifest: {exc}"]) from None
    if manifest.name != name or manifest.version != version:
        raise IntegrityError(
            [f"manifest {where} describes {manifest.spec}, expected {name}:{version}"]
        )
    return manifest


def version_numbers(backend: Backend, name: str, after: int = 0) -> list[int]:
    """Published versions of ``name`` above ``after``, ascending; stray files are ignored."""
    start = layout.manifest(name, after) if after else None
    found = (layout.version_of(info.key) for info in backend.list(layout.versions(name), start))
    return sorted(number for number in found if number is not None and number > after)


class Reader:
    """Read-only access to a store root; ``ArtifactStore`` adds publishing on top."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    @property
    def root(self) -> Path | str:
        """The store directory, or the ``s3://bucket/prefix`` of an object-storage store."""
        return self._backend.root

    def get(self, name: str, version: int | None = None, alias: str = "latest") -> Manifest:
        """The manifest of ``name:version``, or of the version ``name@alias`` points at.

        ``name`` may also be a whole reference (``"maml:17"``, ``"maml@prod"``) when
        ``version`` and ``alias`` are left at their defaults.
        """
        is_spec = isinstance(name, str) and ("@" in name or ":" in name)
        if is_spec and version is None and alias == "latest":
            return self._manifest_for(name)
        if version is not None:
            return read_manifest(self._backend, name, parse_version(version))
        current = self._alias_version(name, alias)
        if current is None:
            if not version_numbers(self._backend, name):
                raise ArtifactNotFoundError(
                    f"no artifact named {name!r} in {self.root}{_known(self._backend)}"
                )
            aliases = ", ".join(sorted(self.aliases(name))) or "none"
            raise ArtifactNotFoundError(
                f"artifact {name!r} has no alias {alias!r} (aliases: {aliases})"
            )
        return read_manifest(self._backend, name, current)

    def resolve(self, spec: str) -> ArtifactRef:
        """``"name:17"``, ``"name@alias"`` or ``"name"`` (= ``name@latest``) -> ArtifactRef."""
        return self._ref(self._manifest_for(spec))

    def list_names(self) -> list[str]:
        """Names with at least one published version, sorted."""
        names = self._backend.children(layout.NAMES)
        return [name for name in names if _is_name(name) and version_numbers(self._backend, name)]

    def list_versions(self, name: str) -> list[int]:
        """Published version numbers of ``name``, ascending (empty if none)."""
        return version_numbers(self._backend, validate_name(name))

    def aliases(self, name: str) -> dict[str, int]:
        """``{alias: version}`` for ``name``."""
        found = {}
        for info in self._backend.list(layout.aliases(name)):
            alias = info.key.rsplit("/", 1)[-1].removesuffix(".json")
            version = self._alias_version(name, alias) if _is_name(alias) else None
            if version is not None:
                found[alias] = version
        return dict(sorted(found.items()))

    def verify(self, ref: ArtifactRef | Manifest | str) -> Manifest:
        """Re-hash every file of a version; IntegrityError lists each one that differs."""
        manifest = self._manifest_for(ref)
        problems = []
        for file_name, entry in sorted(manifest.files.items()):
            try:
                if entry.digest_of == "tensors":
                    self._checked_params(manifest, file_name, entry)
                else:
                    self._checked_bytes(manifest, file_name, entry)
            except IntegrityError as exc:
                problems.extend(exc.problems)
        if problems:
            raise IntegrityError(problems)
        return manifest

    def load_params(
        self, ref: ArtifactRef | Manifest | str, device: str | torch.device = "cpu"
    ) -> dict[str, dict[str, torch.Tensor]]:
        """``{module_id: {param_name: Tensor}}`` on ``device``, after checking the digest.

        Ready for ``torch.func.functional_call(module, params[module_id], ...)`` or
        ``module.load_state_dict(params[module_id])``. A params blob whose tensors do not
        match the manifest raises IntegrityError and nothing is returned.
        """
        manifest = self._manifest_for(ref)
        parsed = self._checked_params(manifest, PARAMS_FILE, manifest.files[PARAMS_FILE])
        return decode_params(parsed, device)

    def read_file(self, ref: ArtifactRef | Manifest | str, file_name: str) -> bytes:
        """The verified bytes of one file of a version (``metrics.json``, an attachment...)."""
        manifest = self._manifest_for(ref)
        entry = manifest.files.get(file_name)
        if entry is None:
            raise ArtifactNotFoundError(
                f"{manifest.spec} has no file {file_name!r} "
                f"(files: {', '.join(sorted(manifest.files))})"
            )
        if entry.digest_of == "tensors":
            return bytes(self._checked_params(manifest, file_name, entry).buffer)
        return self._checked_bytes(manifest, file_name, entry)

    def lineage(self, ref: ArtifactRef | Manifest | str) -> list[Manifest]:
        """The version and its ancestors, newest first, following ``lineage.parent``."""
        chain = [self._manifest_for(ref)]
        seen = {chain[0].spec}
        while (parent := chain[-1].lineage.parent) is not None:
            if parent in seen:
                raise IntegrityError([f"lineage of {chain[0].spec} loops back to {parent}"])
            seen.add(parent)
            chain.append(self._manifest_for(parent))
        return chain

    def export(
        self, ref: ArtifactRef | Manifest | str, directory: str | os.PathLike[str]
    ) -> list[Path]:
        """Write every file of a version plus ``manifest.json`` into ``directory``.

        Each file is verified before it is written; existing files are never
        overwritten. ``params.safetensors`` opens with any safetensors reader.
        """
        manifest = self._manifest_for(ref)
        target = Path(directory)
        names = [*sorted(manifest.files), "manifest.json"]
        clashes = [name for name in names if (target / name).exists()]
        if clashes:
            raise FileExistsError(
                f"refusing to overwrite {', '.join(clashes)} in {target}; "
                f"export into an empty directory"
            )
        contents = {name: self.read_file(manifest, name) for name in sorted(manifest.files)}
        contents["manifest.json"] = manifest.model_dump_json(indent=2).encode()
        target.mkdir(parents=True, exist_ok=True)
        written = []
        for name in names:
            with open(target / name, "xb") as handle:
                handle.write(contents[name])
            written.append(target / name)
        return written

    # ------------------------------------------------------------------- internals

    def _manifest_for(self, ref: ArtifactRef | Manifest | str) -> Manifest:
        if isinstance(ref, Manifest):
            return read_manifest(self._backend, ref.name, ref.version)
        if isinstance(ref, ArtifactRef):
            manifest = read_manifest(self._backend, ref.name, ref.version)
            if manifest.params_digest != ref.digest:
                raise IntegrityError(
                    [
                        f"{ref} has params digest {manifest.params_digest} in {self.root}, "
                        f"but the reference says {ref.digest}"
                    ]
                )
            return manifest
        spec = parse_spec(ref)
        return self.get(spec.name, version=spec.version, alias=spec.alias or "latest")

    def _ref(self, manifest: Manifest) -> ArtifactRef:
        uri = self._backend.uri(layout.manifest(manifest.name, manifest.version))
        return ArtifactRef(manifest.name, manifest.version, manifest.params_digest, uri)

    def _alias_version(self, name: str, alias: str) -> int | None:
        return alias_record(self._backend, name, alias)[0]

    def _checked_params(self, manifest: Manifest, file_name: str, entry: FileEntry) -> ParsedParams:
        blob = layout.blob(entry.digest)
        where = f"{manifest.spec} file {file_name!r} (blob {self._backend.where(blob)})"
        try:
            # Each tensor is hashed as soon as its bytes are in, while the rest arrives.
            download = self._backend.read_stream(blob)
            parsed, found, tensors = receive_params(download, self._backend.where(blob))
        except FileNotFoundError:
            raise IntegrityError([f"{where} is missing; expected digest {entry.digest}"]) from None
        except IntegrityError as exc:
            raise IntegrityError(
                [f"{where}: expected digest {entry.digest}, but {p}" for p in exc.problems]
            ) from None
        if found != entry.digest:
            changed = {
                key
                for key in set(tensors) | set(manifest.tensors)
                if key not in tensors
                or key not in manifest.tensors
                or tensors[key].digest != manifest.tensors[key].digest
            }
            detail = f"; tensors that differ: {describe(changed)}" if changed else ""
            raise IntegrityError(
                [f"{where} is corrupt: expected digest {entry.digest}, found {found}{detail}"]
            )
        return parsed

    def _checked_bytes(self, manifest: Manifest, file_name: str, entry: FileEntry) -> bytes:
        blob = layout.blob(entry.digest)
        where = f"{manifest.spec} file {file_name!r} (blob {self._backend.where(blob)})"
        try:
            data = self._backend.read(blob)
        except FileNotFoundError:
            raise IntegrityError([f"{where} is missing; expected digest {entry.digest}"]) from None
        found = sha256_hex(data)
        if found != entry.digest:
            raise IntegrityError(
                [f"{where} is corrupt: expected digest {entry.digest}, found {found}"]
            )
        return bytes(data)


def alias_record(backend: Backend, name: str, alias: str) -> tuple[int | None, str | None]:
    """The version ``name@alias`` points at and the ETag to swap it with (None, None if unset)."""
    key = layout.alias(name, alias)
    tagged = backend.read_tagged(key)
    if tagged is None:
        return None, None
    try:
        return AliasRecord.model_validate_json(tagged.data).version, tagged.etag
    except ValidationError as exc:
        raise IntegrityError([f"alias file {backend.where(key)} is not valid: {exc}"]) from None


def _is_name(text: str) -> bool:
    try:
        validate_name(text)
    except ValueError:
        return False
    return True


def _known(backend: Backend) -> str:
    names = Reader(backend).list_names()
    if not names:
        return " (the store has no artifacts yet)"
    shown = ", ".join(names[:10]) + (", ..." if len(names) > 10 else "")
    return f" (artifacts: {shown})"


def _ranges(numbers: list[int]) -> str:
    return f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])
