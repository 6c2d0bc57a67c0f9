"""Storage backends: the few primitives the store's protocol is written against.

``ArtifactStore`` publishes and reads with these operations only, so one protocol (see
``pipeline.artifacts.store``) holds for every backend:

- ``put_if_absent``: create an object only if its key is free (version manifests);
- ``swap``: replace an object only if it is still the one read (compare-and-swap on its
  ETag; aliases); ``None`` as the expected ETag means "must not exist yet";
- ``store_blob``: content-addressed write, a no-op (that refreshes the blob's age) when the
  key exists; ``store_stream`` the same for a blob given as buffers whose key (its digest)
  is still being computed: a local backend writes and fsyncs while the caller hashes, S3
  needs the key before it uploads;
- ``claim``: mutual exclusion between publishers of one idempotency key;
- ``read``, ``read_stream`` (fill a buffer and report progress, so the caller hashes what
  has arrived while the rest comes), ``read_tagged``, ``put``, ``list``, ``children``,
  ``delete``.

Keys are relative, ``/``-separated and built by ``pipeline.artifacts.records.layout`` from
validated names only. Ages are measured by the storage's own clock (file mtimes, the S3
server's ``Date`` against ``LastModified``), so clients with skewed clocks agree on them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    from pipeline.artifacts.content.params_blob import Download


class ObjectInfo(NamedTuple):
    """One listed object: its key relative to the store root, size and age in seconds."""

    key: str
    size: int
    age: float


class Tagged(NamedTuple):
    """An object's contents and the ETag a ``swap`` must present to replace it."""

    data: bytes
    etag: str


class Backend(Protocol):
    root: Path | str
    """The store's location: the directory, or the ``s3://bucket/prefix`` string."""
    default_gc_age: float
    """Seconds a leftover must have aged before ``gc`` removes it by default."""
    writes_before_key: bool
    """Whether ``store_stream`` writes the buffers before it asks for their key (a local
    file) rather than after (an upload to the key): hashing then shares the cores with
    that write."""

    def where(self, key: str) -> str:
        """The object's location for messages (a path or an ``s3://`` URI)."""
        ...

    def uri(self, key: str) -> str: ...

    def read(self, key: str) -> memoryview:
        """The whole object in a writable buffer; FileNotFoundError naming it when absent."""
        ...

    def read_stream(self, key: str) -> Download:
        """The object in a writable buffer filled as ``Download.filled`` is iterated;
        FileNotFoundError naming it when absent."""
        ...

    def read_tagged(self, key: str) -> Tagged | None: ...

    def put_if_absent(self, key: str, data: bytes) -> bool: ...

    def swap(self, key: str, data: bytes, etag: str | None) -> bool: ...

    def put(self, key: str, data: bytes) -> None: ...

    def store_blob(self, key: str, source: bytes | Path) -> None: ...

    def store_stream(self, buffers: Sequence[memoryview], key: Callable[[], str]) -> None:
        """``store_blob`` of the buffers' concatenation under ``key()``, called once, as late
        as the backend can."""
        ...

    def staging_file(self) -> Path:
        """A fresh local path to write a large file to before ``store_blob``."""
        ...

    def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        """Objects under ``prefix`` (recursively), sorted by key."""
        ...

    def children(self, prefix: str) -> list[str]:
        """Names of the immediate sub-folders of ``prefix``, sorted."""
        ...

    def delete(self, key: str) -> None: ...

    def claim(self, key: str, timeout: float) -> contextlib.AbstractContextManager[Lease]: ...

    def for_writing(self) -> contextlib.AbstractContextManager[None]:
        """Held by publishers while they write; excludes ``for_gc`` where that is possible."""
        ...

    def for_gc(self) -> contextlib.AbstractContextManager[None]: ...

    def remove_staged(self, older_than: float) -> int:
        """Remove what crashed writers left outside the store's keys; returns the count."""
        ...


class Lease(Protocol):
    def check(self) -> None:
        """Raise if the claim may have been taken over (its lease ran out); else nothing."""
        ...


def new_buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` bytes that is not zero-filled first: a ``bytearray``
    writes every byte once before a read overwrites it (measured: 0.1-0.2 s per 100 MB)."""
    import numpy as np

    return memoryview(np.empty(size, dtype=np.uint8))
