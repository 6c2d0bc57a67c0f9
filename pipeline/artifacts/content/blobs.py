"""Writing content-addressed blobs: hash, store under the digest.

Blobs are written before any version number is claimed and before any claim is taken,
so concurrent publishers only contend on the small manifest write. A blob that is
already present (same digest) is not written again, only marked as in use (see
``Backend.store_blob``). Blobs of a publish that never reaches its manifest are
unreferenced and removed by ``ArtifactStore.gc``.
"""

from __future__ import annotations

import functools
import hashlib
import mimetypes
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.artifacts.backends.base import Backend
from pipeline.artifacts.content.digest import EncodedParams
from pipeline.artifacts.content.params_blob import TensorHashes, encode_params
from pipeline.artifacts.records import layout
from pipeline.artifacts.records.manifest import FileEntry
from pipeline.io import fsio

if TYPE_CHECKING:
    import torch

SAFETENSORS_TYPE = "application/vnd.safetensors"


def media_type(file_name: str) -> str:
    guessed, _ = mimetypes.guess_type(file_name, strict=False)
    return guessed or "application/octet-stream"


class BlobWriter:
    """Writes the blobs of one publish through a backend."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    def put_params(
        self, modules: tuple[str, ...], flat: dict[str, torch.Tensor]
    ) -> tuple[FileEntry, EncodedParams]:
        """Store the params blob straight from the tensors' memory, hashing them meanwhile.

        The blob's key is its digest: a local backend writes and fsyncs the file while the
        tensors are hashed and asks for the key only then; S3 needs it before uploading.
        """
        stream = encode_params(modules, flat)
        beside_writer = self._backend.writes_before_key
        with TensorHashes(stream.size, beside_writer=beside_writer) as hashes:
            for key, view in zip(stream.keys, stream.chunks[1:], strict=True):
                hashes.add(key, view)
            encoded = functools.cache(lambda: stream.encoded(hashes.digests()))
            self._backend.store_stream(stream.chunks, lambda: layout.blob(encoded().digest))
            result = encoded()
        entry = FileEntry(
            digest=result.digest, size=stream.size, media_type=SAFETENSORS_TYPE, digest_of="tensors"
        )
        return entry, result

    def put_bytes(self, data: bytes, media: str) -> FileEntry:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._backend.store_blob(layout.blob(digest), data)
        return FileEntry(digest=digest, size=len(data), media_type=media)

    def put_file(self, source: Path, media: str) -> FileEntry:
        """Copy a file into the store, hashing it on the way (read once)."""
        staged = self._backend.staging_file()
        digest = hashlib.sha256()
        size = 0
        try:
            with open(source, "rb") as reader, open(staged, "wb") as writer:
                while chunk := reader.read(1 << 20):
                    digest.update(chunk)
                    writer.write(chunk)
                    size += len(chunk)
            hex_digest = "sha256:" + digest.hexdigest()
            self._backend.store_blob(layout.blob(hex_digest), staged)
        finally:
            fsio.remove_quietly(staged)
        return FileEntry(digest=hex_digest, size=size, media_type=media)
