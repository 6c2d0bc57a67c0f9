"""The local-directory backend: staged files, ``os.link``/``os.replace`` and ``flock``.

- ``put_if_absent`` stages the bytes in ``ROOT/tmp`` and ``os.link``s them to the final
  name: the kernel refuses an existing name, so two publishers cannot both create version
  17, and no reader ever sees a half-written file.
- ``swap`` holds ``flock`` on the folder's ``.lock`` while it compares the current file's
  ETag (its sha256) and ``os.replace``s it.
- ``claim`` is an ``flock`` too: the kernel drops it when its holder dies, even by
  SIGKILL, so a crashed publisher never leaves a stale claim and no lease is needed.
- Publishers hold ``ROOT/.gc.lock`` shared and ``gc`` holds it exclusively, so ``gc``
  never runs beside a publish and may remove leftovers of any age (``default_gc_age`` 0).

``durable=True`` fsyncs file contents before their names appear and the directory entry
after, so a power loss cannot leave a name pointing at incomplete contents.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pipeline.artifacts.backends.base import ObjectInfo, Tagged, new_buffer
from pipeline.artifacts.content.params_blob import Download
from pipeline.io import fsio

_MAP_BYTES = 1 << 20
"""Files at least this large are mapped rather than read (the params blobs)."""


class _NoLease:
    def check(self) -> None:
        """An flock cannot be taken over while its holder lives."""


class LocalBackend:
    default_gc_age = 0.0
    writes_before_key = True

    def __init__(self, root: Path, *, durable: bool, lock_timeout: float) -> None:
        self.root = root
        self._durable = durable
        self._lock_timeout = lock_timeout
        self._tmp = root / "tmp"

    def where(self, key: str) -> str:
        return str(self._path(key))

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def read(self, key: str) -> memoryview:
        with open(self._path(key), "rb", buffering=0) as handle:
            size = os.fstat(handle.fileno()).st_size
            if size >= _MAP_BYTES:
                # A private copy-on-write mapping: no copy, and whoever writes into the
                # tensors made from it gets pages of their own. Blobs are never rewritten
                # (read-only, linked once), so the pages verified are the pages loaded.
                return memoryview(mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY))
            buffer = new_buffer(size)
            filled = 0
            while filled < size and (count := handle.readinto(buffer[filled:])):
                filled += count
        return buffer[:filled]

    def read_stream(self, key: str) -> Download:
        data = self.read(key)
        return Download(data, iter((len(data),)))

    def read_tagged(self, key: str) -> Tagged | None:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            return None
        return Tagged(data, hashlib.sha256(data).hexdigest())

    def put_if_absent(self, key: str, data: bytes) -> bool:
        staged = fsio.write_temp(self._tmp, data, durable=self._durable)
        try:
            return self._link(staged, self._path(key))
        finally:
            fsio.remove_quietly(staged)

    def swap(self, key: str, data: bytes, etag: str | None) -> bool:
        path = self._path(key)
        with fsio.file_lock(path.parent / ".lock", timeout=self._lock_timeout):
            current = self.read_tagged(key)
            if (current.etag if current is not None else None) != etag:
                return False
            self._replace(path, data)
        return True

    def put(self, key: str, data: bytes) -> None:
        self._replace(self._path(key), data)

    def store_blob(self, key: str, source: bytes | Path) -> None:
        final = self._path(key)
        if self._reuse(final):
            return
        if isinstance(source, bytes):
            staged = fsio.write_temp(self._tmp, source, durable=self._durable)
        else:
            staged = source
            if self._durable:
                fsio.fsync_file(staged)
        try:
            self._link(staged, final)
        finally:
            if staged is not source:
                fsio.remove_quietly(staged)

    def store_stream(self, buffers: Sequence[memoryview], key: Callable[[], str]) -> None:
        # Written and fsynced before the key is asked for: the caller hashes meanwhile.
        staged = fsio.temp_path(self._tmp)
        try:
            fsio.write_buffers(staged, buffers, durable=self._durable)
            final = self._path(key())
            if not self._reuse(final):
                self._link(staged, final)
        finally:
            fsio.remove_quietly(staged)

    def staging_file(self) -> Path:
        return fsio.temp_path(self._tmp)

    def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        base = self._path(prefix)
        now = time.time()
        found = []
        for folder, _, files in os.walk(base):
            for file_name in files:
                path = Path(folder) / file_name
                key = path.relative_to(self.root).as_posix()
                if file_name.startswith(".") or (start_after is not None and key <= start_after):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    stat = path.stat()
                    found.append(ObjectInfo(key, stat.st_size, now - stat.st_mtime))
        return sorted(found)

    def children(self, prefix: str) -> list[str]:
        try:
            return sorted(entry.name for entry in os.scandir(self._path(prefix)) if entry.is_dir())
        except FileNotFoundError:
            return []

    def delete(self, key: str) -> None:
        fsio.remove_quietly(self._path(key))

    def claim(self, key: str, timeout: float) -> contextlib.AbstractContextManager[_NoLease]:
        return _flock_claim(self._path(key), timeout)

    def for_writing(self) -> contextlib.AbstractContextManager[None]:
        return fsio.file_lock(self.root / ".gc.lock", shared=True, timeout=self._lock_timeout)

    def for_gc(self) -> contextlib.AbstractContextManager[None]:
        if not self.root.exists():
            return contextlib.nullcontext()  # nothing to collect; do not create the root
        return fsio.file_lock(self.root / ".gc.lock", timeout=self._lock_timeout)

    def remove_staged(self, older_than: float) -> int:
        now = time.time()
        removed = 0
        for path in self._tmp.glob("*") if self._tmp.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):
                if path.is_file() and now - path.stat().st_mtime >= older_than:
                    path.unlink()
                    removed += 1
        return removed

    # ------------------------------------------------------------------- internals

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/")) if key else self.root

    def _reuse(self, final: Path) -> bool:
        """True if the blob exists (same digest, same contents), after renewing its mtime,
        which tells gc it is in use again."""
        if not final.exists():
            return False
        with contextlib.suppress(OSError):
            os.utime(final)
        return True

    def _link(self, staged: Path, final: Path) -> bool:
        created = [folder for folder in (final.parent.parent, final.parent) if not folder.exists()]
        if not fsio.link_new(staged, final):
            return False
        if self._durable:
            for folder in {final.parent, *(new.parent for new in created)}:
                fsio.fsync_dir(folder)
        return True

    def _replace(self, final: Path, data: bytes) -> None:
        staged = fsio.write_temp(self._tmp, data, durable=self._durable)
        try:
            fsio.replace(staged, final, durable=self._durable)
        finally:
            fsio.remove_quietly(staged)


@contextlib.contextmanager
def _flock_claim(path: Path, timeout: float) -> Iterator[_NoLease]:
    with fsio.file_lock(path, timeout=timeout):
        yield _NoLease()
