"""Writing content-addressed blobs: stage in ``ROOT/tmp``, hash, link under the digest.

Blobs are written before any version number is claimed, outside the per-artifact lock,
so concurrent publishers only serialise on the small manifest write. A blob that is
already present (same digest) is not written again. Blobs of a publish that never
reaches its manifest are unreferenced and removed by ``ArtifactStore.gc``.
"""

from __future__ import annotations

import hashlib
import mimetypes
import os
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.artifacts import fsio
from pipeline.artifacts.digest import EncodedParams, write_params
from pipeline.artifacts.layout import Layout
from pipeline.artifacts.manifest import FileEntry

if TYPE_CHECKING:
    import torch

SAFETENSORS_TYPE = "application/vnd.safetensors"


def media_type(file_name: str) -> str:
    guessed, _ = mimetypes.guess_type(file_name, strict=False)
    return guessed or "application/octet-stream"


class BlobWriter:
    """Writes the blobs of one publish; ``sync`` makes their directory entries durable."""

    def __init__(self, layout: Layout, *, durable: bool) -> None:
        self._layout = layout
        self._durable = durable
        self._dirs_to_sync: set[Path] = set()

    def put_params(
        self, modules: tuple[str, ...], flat: dict[str, torch.Tensor]
    ) -> tuple[FileEntry, EncodedParams]:
        staged = fsio.temp_path(self._layout.tmp, ".safetensors")
        try:
            encoded = write_params(modules, flat, staged)
            if self._durable:
                fsio.fsync_file(staged)
            size = staged.stat().st_size
            self._commit(staged, encoded.digest)
        finally:
            fsio.remove_quietly(staged)
        entry = FileEntry(
            digest=encoded.digest, size=size, media_type=SAFETENSORS_TYPE, digest_of="tensors"
        )
        return entry, encoded

    def put_bytes(self, data: bytes, media: str) -> FileEntry:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if not self._layout.blob(digest).exists():
            staged = fsio.write_temp(self._layout.tmp, data, durable=self._durable)
            try:
                self._commit(staged, digest)
            finally:
                fsio.remove_quietly(staged)
        return FileEntry(digest=digest, size=len(data), media_type=media)

    def put_file(self, source: Path, media: str) -> FileEntry:
        """Copy a file into the store, hashing it on the way (read once)."""
        staged = fsio.temp_path(self._layout.tmp)
        digest = hashlib.sha256()
        size = 0
        try:
            with open(source, "rb") as reader, open(staged, "wb") as writer:
                while chunk := reader.read(1 << 20):
                    digest.update(chunk)
                    writer.write(chunk)
                    size += len(chunk)
                writer.flush()
                if self._durable:
                    os.fsync(writer.fileno())
            hex_digest = "sha256:" + digest.hexdigest()
            self._commit(staged, hex_digest)
        finally:
            fsio.remove_quietly(staged)
        return FileEntry(digest=hex_digest, size=size, media_type=media)

    def sync(self) -> None:
        """fsync the directories that gained a blob (before a manifest may refer to it)."""
        if self._durable:
            for directory in sorted(self._dirs_to_sync):
                fsio.fsync_dir(directory)
        self._dirs_to_sync.clear()

    def _commit(self, staged: Path, digest: str) -> None:
        final = self._layout.blob(digest)
        new_dir = not final.parent.exists()
        if fsio.link_new(staged, final):
            self._dirs_to_sync.add(final.parent)
            if new_dir:
                self._dirs_to_sync.add(final.parent.parent)
