"""Crash-safe file primitives: staged temp files, atomic publication, fsync, file locks.

Shared by the artifact store and ``pipeline.io.checkpoints``.

Every file of the store is first written completely under ``ROOT/tmp/`` and then made
visible with one atomic step: ``os.link`` when the name must not exist yet (blobs,
manifests: the kernel refuses a second writer, so an existing version is never
overwritten) or ``os.replace`` when the name is meant to move (aliases, key index).
A reader therefore sees a whole file or no file. ``durable=True`` adds the fsyncs
that make the order "file contents, then directory entry" survive a power loss.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from pipeline.artifacts.errors import LockTimeoutError

_READ_ONLY = 0o444


def temp_path(tmp_dir: Path) -> Path:
    """A fresh name in ``tmp_dir``; the pid prefix says which process left it there."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    return tmp_dir / f"{os.getpid()}-{uuid.uuid4().hex}.part"


def write_temp(tmp_dir: Path, data: bytes, *, durable: bool) -> Path:
    """Write ``data`` to a new temp file (fsynced when durable) and return its path."""
    path = temp_path(tmp_dir)
    write_file(path, data, durable=durable)
    return path


def write_file(path: Path, data: bytes, *, durable: bool) -> None:
    """Write ``data`` to ``path``; with ``durable`` its contents reach the disk before this
    returns."""
    write_buffers(path, [data], durable=durable)


def write_buffers(path: Path, buffers: Iterable[bytes | memoryview], *, durable: bool) -> None:
    """Write the buffers one after another to ``path`` (fsynced when durable).

    Each buffer goes to the kernel as it is (no joining copy); the fsync is on the same
    descriptor, so the file is not opened a second time to persist it.
    """
    with open(path, "wb") as handle:
        for buffer in buffers:
            handle.write(buffer)
        handle.flush()
        if durable:
            os.fsync(handle.fileno())


def fsync_file(path: Path) -> None:
    """Persist the contents of a file written elsewhere (e.g. by safetensors)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Persist a directory's entries (new names linked or replaced into it)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def link_new(staged: Path, final: Path) -> bool:
    """Give ``staged`` the name ``final`` unless that name exists; True if it was created.

    The staged file is made read-only first: published files are immutable.
    """
    os.chmod(staged, _READ_ONLY)
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(staged, final)
    except FileExistsError:
        return False
    return True


def replace(staged: Path, final: Path, *, durable: bool) -> None:
    """Atomically point ``final`` at the contents of ``staged``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, final)
    if durable:
        fsync_dir(final.parent)


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


@contextlib.contextmanager
def file_lock(path: Path, *, shared: bool = False, timeout: float) -> Iterator[None]:
    """Hold ``flock`` on ``path`` (created if missing) for the ``with`` block.

    ``flock`` rather than a lock file created with O_EXCL: the kernel drops the lock when
    its holder dies, even by SIGKILL, so a crashed publisher never leaves a stale lock
    behind. The wait polls with LOCK_NB so that it can give up after ``timeout`` seconds
    with an error instead of hanging.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        deadline = time.monotonic() + timeout
        pause = 0.0005
        while True:
            try:
                fcntl.flock(fd, mode)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise
            if time.monotonic() >= deadline:
                kind = "shared" if shared else "exclusive"
                raise LockTimeoutError(
                    f"gave up after {timeout:g} s waiting for the {kind} lock {path}: "
                    f"another process holds it (a publish, alias change or gc in progress)"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.02)
        yield
    finally:
        os.close(fd)
