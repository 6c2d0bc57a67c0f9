"""Where run directories live: a local directory or an S3 prefix, behind one interface.

``runs_root(checkpoint_dir)`` opens the runs root that ``training.checkpoint_dir`` names and
``run_at(location)`` one run directory (what ``offmeta run --resume RUN_DIR`` names). Both
kinds offer the operations ``flows.runs.run_dirs`` and ``flows.runs.retention`` build on:

- **local** (a path or ``file://`` URI): files are replaced atomically and durably (write,
  fsync, rename) and ``run.lock`` is ``flock``-ed by the process running the run; the kernel
  drops the lock when that process dies, even by SIGKILL.
- **S3** (``s3://bucket/prefix``; endpoint and credentials from the standard AWS
  variables, as for datasets and the artifact store): ``run.json`` is replaced with
  ``PutObject IfMatch=<ETag read>`` (or created with ``IfNoneMatch='*'``), ``finished.json``
  is created with ``IfNoneMatch='*'``, and ``run.lock`` is an object created with
  ``IfNoneMatch='*'`` naming its holder (host, pid) that the holder renews every
  ``LOCK_LEASE_S / 4`` seconds. Nobody drops a lock for a killed holder, so a lock counts as
  held while its holder may be alive: a process on this host that still exists, or, on
  another host, one that renewed it within ``LOCK_LEASE_S`` (by the server's clock). A lock
  that is not held is taken over with ``IfMatch`` on its ETag, so of two drivers resuming
  one run at once, one wins and the other is refused.

A run being removed (``RunDir.remove``, under its lock) stops being a run at once: locally
it is renamed to a dot-name, on S3 a ``.removing`` marker is written and ``run.json`` deleted
first. ``RunsRoot.sweep`` deletes what an interrupted removal left.

Nothing here imports Prefect, Ray or torch; boto3 only for an S3 root.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from pipeline.artifacts.errors import UnsupportedRootError
from pipeline.artifacts.records.roots import S3Root, parse_root
from pipeline.io.fsio import fsync_dir, write_file

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
FINISHED_FILE = "finished.json"
LOCK_LEASE_S = 60.0
"""Seconds an S3 run lock held from another host stays held without being renewed."""
_REMOVING = ".removing-"
_REMOVING_MARKER = ".removing"
_CLOCK_RESOLUTION_S = 1.0  # S3's Last-Modified and Date headers have whole seconds


class RunDirError(ValueError):
    """A run directory cannot be used as asked; the message says why and what to do."""


class Holder(NamedTuple):
    """The process holding a run's lock: its pid (0: it wrote none) and, on S3, its host."""

    pid: int
    host: str | None = None

    def __str__(self) -> str:
        where = f" on {self.host}" if self.host else ""
        return f"{self.pid or '(unknown)'}{where}"


class RunDir(abc.ABC):
    """One run directory: a few small files and a lock; checkpoints go beside them."""

    where: Path | str
    """What messages show and ``--resume`` takes: the directory, or its ``s3://`` URI."""
    name: str
    """The run id: the last part of ``where``."""

    @abc.abstractmethod
    def exists(self) -> bool:
        """True when the directory (or anything under the S3 prefix) exists."""

    @abc.abstractmethod
    def read(self, file: str) -> bytes | None:
        """The content of ``file``, or None when there is none."""

    @abc.abstractmethod
    def replace(self, file: str, data: bytes) -> None:
        """Replace ``file`` with ``data`` at once (a reader sees the old or the new content);
        on S3 only if nobody changed it since this object last read it."""

    @abc.abstractmethod
    def write_once(self, file: str, data: bytes) -> None:
        """Write ``file``, which nobody may have written before (``RunDirError`` if so on S3)."""

    @abc.abstractmethod
    def create(self, file: str, data: bytes) -> bool:
        """Create ``file`` (in folders made as needed) unless it exists; True when this call
        created it. Of several processes creating one file, on any hosts, exactly one does."""

    @abc.abstractmethod
    def files(self, folder: str) -> list[str]:
        """The names of the files in ``folder``, sorted; none when it does not exist."""

    @abc.abstractmethod
    def hold(self) -> contextlib.AbstractContextManager[None]:
        """Hold the run's lock for the ``with`` block; ``RunDirError`` if a live process
        holds it."""

    @abc.abstractmethod
    def holder(self) -> Holder | None:
        """The live process holding the run's lock; None when none does."""

    @abc.abstractmethod
    def last_active(self) -> float:
        """When the run last wrote something (seconds since the epoch): run.json, and each
        checkpoint's folder."""

    @abc.abstractmethod
    def remove(self) -> None:
        """Stop being a run at once, then delete everything; call it holding the lock."""


class RunsRoot(abc.ABC):
    """``training.checkpoint_dir``: one run directory per run."""

    where: Path | str

    @abc.abstractmethod
    def run(self, name: str) -> RunDir:
        """The run directory ``name`` under this root (it may not exist)."""

    @abc.abstractmethod
    def names(self) -> list[str]:
        """Names of the entries under the root, sorted, without the dot-names."""

    @abc.abstractmethod
    def create(self, name: str) -> RunDir:
        """A new, empty run directory ``name``; ``RunDirError`` if it exists."""

    @abc.abstractmethod
    def sweep(self) -> None:
        """Delete what interrupted removals left."""


def runs_root(checkpoint_dir: str | os.PathLike[str], access: S3Access | None = None) -> RunsRoot:
    """The runs root ``checkpoint_dir`` names (on S3 with ``access``, by default this
    process's AWS variables); ``RunDirError`` for a scheme other than ``file://`` and
    ``s3://``."""
    parsed = parse_location(checkpoint_dir)
    if isinstance(parsed, S3Root):
        return S3RunsRoot(parsed, access or S3Access.from_environment())
    return LocalRunsRoot(parsed)


def run_at(location: str | os.PathLike[str], access: S3Access | None = None) -> RunDir:
    """The run directory at ``location`` (a path, or ``s3://bucket/prefix/RUN``, reached
    with ``access``: by default this process's AWS variables)."""
    parsed = parse_location(location)
    if isinstance(parsed, S3Root):
        parent, _, name = parsed.prefix.rpartition("/")
        if not name:
            raise RunDirError(
                f"{location}: names a bucket, not a run directory; expected "
                "s3://bucket/prefix/<run id>"
            )
        root = S3RunsRoot(S3Root(parsed.bucket, parent), access or S3Access.from_environment())
        return root.run(name)
    return LocalRunDir(parsed)


def parse_location(location: str | os.PathLike[str]) -> Path | S3Root:
    """A local path (as given, relative or not) or the bucket and prefix of an ``s3://`` URI;
    ``RunDirError`` for any other scheme, as ``artifacts.root`` refuses them."""
    if isinstance(location, os.PathLike) or "://" not in location:
        return Path(location)
    try:
        return parse_root(location, what="training.checkpoint_dir", writer="offmeta's run storage")
    except UnsupportedRootError as error:
        raise RunDirError(str(error)) from None


def is_s3(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` is an ``s3://`` URI."""
    return isinstance(location, str) and location.lower().startswith("s3://")


# --------------------------------------------------------------------------- local


class LocalRunsRoot(RunsRoot):
    def __init__(self, root: Path) -> None:
        self.where = root

    def run(self, name: str) -> RunDir:
        return LocalRunDir(self.where / name)

    def names(self) -> list[str]:
        try:
            return sorted(e.name for e in self.where.iterdir() if not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def create(self, name: str) -> RunDir:
        path = self.where / name
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise RunDirError(_exists_already(path)) from None
        return LocalRunDir(path)

    def sweep(self) -> None:
        for doomed in self.where.glob(f"{_REMOVING}*"):
            shutil.rmtree(doomed, ignore_errors=True)


class LocalRunDir(RunDir):
    def __init__(self, path: Path) -> None:
        self.where = path
        self.name = path.name

    def exists(self) -> bool:
        return self.where.is_dir()

    def read(self, file: str) -> bytes | None:
        try:
            return (self.where / file).read_bytes()
        except FileNotFoundError:
            return None

    def replace(self, file: str, data: bytes) -> None:
        path = self.where / file
        staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        write_file(staged, data, durable=True)
        os.replace(staged, path)
        fsync_dir(path.parent)

    def write_once(self, file: str, data: bytes) -> None:
        self.replace(file, data)

    def create(self, file: str, data: bytes) -> bool:
        path = self.where / file
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as created:
            created.write(data)
            created.flush()
            os.fsync(created.fileno())
        fsync_dir(path.parent)
        return True

    def files(self, folder: str) -> list[str]:
        try:
            entries = (self.where / folder).iterdir()
            return sorted(entry.name for entry in entries if entry.is_file())
        except FileNotFoundError:
            return []

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        fd = self._lock()
        try:
            yield
        finally:
            os.close(fd)

    def holder(self) -> Holder | None:
        try:
            fd = os.open(self.where / LOCK_FILE, os.O_RDWR)
        except FileNotFoundError:
            return None
        try:
            return _flock_holder(fd)
        finally:
            os.close(fd)

    def last_active(self) -> float:
        newest = (self.where / RUN_FILE).stat().st_mtime
        for directory, subdirectories, _ in os.walk(self.where):
            newest = max(newest, os.stat(directory).st_mtime)
            if len(Path(directory).relative_to(self.where).parts) >= 2:
                subdirectories.clear()
        return newest

    def remove(self) -> None:
        doomed = self.where.with_name(f"{_REMOVING}{self.name}")
        self.where.rename(doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def _lock(self) -> int:
        """An open, exclusively flock-ed ``run.lock`` holding this process's pid."""
        try:
            fd = os.open(self.where / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            raise RunDirError(f"{self.where}: no such run directory (removed meanwhile?)") from None
        holder = _flock_holder(fd)
        if holder is not None:
            os.close(fd)
            raise RunDirError(f"{self.where}: {running(holder)}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd


def _flock_holder(fd: int) -> Holder | None:
    """The process whose open file holds the lock file ``fd``; None when it was free (and
    ``fd`` holds it now)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        content = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return Holder(int(content) if content.isdigit() else 0)
    return None


# --------------------------------------------------------------------------- S3


class S3RunsRoot(RunsRoot):
    def __init__(self, root: S3Root, access: S3Access) -> None:
        self.where = str(root)
        self._prefix = root.prefix
        self._backend = _bucket_backend(root.bucket, access)

    def run(self, name: str) -> RunDir:
        return S3RunDir(self._backend, f"{self.where}/{name}", self._key(name))

    def names(self) -> list[str]:
        return [name for name in self._backend.children(self._prefix) if name[:1] != "."]

    def create(self, name: str) -> RunDir:
        run = self.run(name)
        if run.exists():
            raise RunDirError(_exists_already(run.where))
        return run

    def sweep(self) -> None:
        for name in self._backend.children(self._prefix):
            if self._backend.list(f"{self._key(name)}/{_REMOVING_MARKER}"):
                S3RunDir(self._backend, f"{self.where}/{name}", self._key(name)).delete_all()

    def _key(self, name: str) -> str:
        return f"{self._prefix}/{name}" if self._prefix else name


class S3RunDir(RunDir):
    def __init__(self, backend: Any, where: str, key: str) -> None:
        self.where = where
        self.name = key.rpartition("/")[2]
        self._backend = backend
        self._prefix = key
        self._etags: dict[str, str] = {}

    def exists(self) -> bool:
        return bool(self._backend.list(f"{self._prefix}/"))

    def read(self, file: str) -> bytes | None:
        tagged = self._backend.read_tagged(f"{self._prefix}/{file}")
        if tagged is None:
            self._etags.pop(file, None)
            return None
        self._etags[file] = tagged.etag
        return tagged.data

    def replace(self, file: str, data: bytes) -> None:
        if not self._backend.swap(f"{self._prefix}/{file}", data, self._etags.get(file)):
            raise RunDirError(
                f"{self.where}/{file} was changed by another process since this one read it; "
                "expected only the process holding the run's lock to write it"
            )
        self.read(file)  # the new ETag, for the next replace

    def write_once(self, file: str, data: bytes) -> None:
        if not self._backend.put_if_absent(f"{self._prefix}/{file}", data):
            raise RunDirError(f"{self.where}/{file} exists already; expected to write it once")

    def create(self, file: str, data: bytes) -> bool:
        return self._backend.put_if_absent(f"{self._prefix}/{file}", data)

    def files(self, folder: str) -> list[str]:
        folder_key = f"{self._prefix}/{folder.strip('/')}/"
        names = (info.key.removeprefix(folder_key) for info in self._backend.list(folder_key))
        return sorted(name for name in names if "/" not in name)

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        key = f"{self._prefix}/{LOCK_FILE}"
        body = json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "token": uuid.uuid4().hex,
                "lease_s": LOCK_LEASE_S,
            }
        ).encode()
        if not self._backend.put_if_absent(key, body):
            held = self._lock_state()
            if held is not None and held.holder is not None:
                raise RunDirError(f"{self.where}: {running(held.holder)}")
            taken = held is not None and self._backend.swap(key, body, held.etag)
            if not taken and not self._backend.put_if_absent(key, body):
                raise RunDirError(
                    f"{self.where}: another process took its {LOCK_FILE} just now; wait for "
                    "that run to end or stop it first"
                )
        renewal = _Renewal(self._backend, key, body)
        try:
            yield
        finally:
            renewal.stop()
            tagged = self._backend.read_tagged(key)
            if tagged is not None and tagged.data == body:
                self._backend.delete(key)

    def holder(self) -> Holder | None:
        held = self._lock_state()
        return held.holder if held is not None else None

    def last_active(self) -> float:
        ages = [info.age for info in self._backend.list(f"{self._prefix}/")]
        return time.time() - min(ages) if ages else 0.0

    def remove(self) -> None:
        self._backend.put(f"{self._prefix}/{_REMOVING_MARKER}", b"")
        self._backend.delete(f"{self._prefix}/{RUN_FILE}")
        self.delete_all()

    def delete_all(self) -> None:
        """Delete every object under the run's prefix, the removal marker last."""
        keys = [info.key for info in self._backend.list(f"{self._prefix}/")]
        marker = f"{self._prefix}/{_REMOVING_MARKER}"
        for key in sorted(keys, key=lambda key: key == marker):
            self._backend.delete(key)

    def _lock_state(self) -> _LockState | None:
        """The lock object's ETag and its live holder (None: its holder is gone); None
        when there is no lock object."""
        key = f"{self._prefix}/{LOCK_FILE}"
        tagged = self._backend.read_tagged(key)
        if tagged is None:
            return None
        try:
            found = json.loads(tagged.data)
            holder = Holder(int(found["pid"]), str(found["host"]))
            lease = float(found["lease_s"])
        except (ValueError, KeyError, TypeError):
            return _LockState(tagged.etag, Holder(0))  # not offmeta's: never taken over
        if holder.host == socket.gethostname():
            return _LockState(tagged.etag, holder if _pid_alive(holder.pid) else None)
        ages = [info.age for info in self._backend.list(key) if info.key == key]
        fresh = bool(ages) and ages[0] < lease + _CLOCK_RESOLUTION_S
        return _LockState(tagged.etag, holder if fresh else None)


class _LockState(NamedTuple):
    etag: str
    holder: Holder | None


class _Renewal:
    """Puts the held lock object again every ``LOCK_LEASE_S / 4`` seconds (same bytes, so
    the same ETag), which renews its Last-Modified: the lease of a holder on another host."""

    def __init__(self, backend: Any, key: str, body: bytes) -> None:
        self._backend, self._key, self._body = backend, key, body
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="offmeta-run-lock", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def _run(self) -> None:
        from pipeline.artifacts.errors import ArtifactError

        while not self._stopped.wait(LOCK_LEASE_S / 4):
            with contextlib.suppress(ArtifactError):
                tagged = self._backend.read_tagged(self._key)
                if tagged is None or tagged.data != self._body:
                    return  # taken over (this process was presumed gone): nothing to renew
                self._backend.swap(self._key, self._body, tagged.etag)


@dataclasses.dataclass(frozen=True)
class S3Access:
    """What run storage's S3 client is built from: the standard AWS variables of the process
    that started the run (None: boto3's own chain). Ray Train workers get the driver's, so a
    worker on another node writes its run's records with the same endpoint and keys, as the
    datasets' filesystem carries them (``pipeline.io.s3``).

    Not a tuple, and its repr leaves the keys out: Ray Train shows its train loop config in
    the run's state as ``str()`` of each value, tuples item by item."""

    endpoint: str | None = None
    region: str | None = None
    key_id: str | None = dataclasses.field(default=None, repr=False)
    secret: str | None = dataclasses.field(default=None, repr=False)
    token: str | None = dataclasses.field(default=None, repr=False)

    @classmethod
    def from_environment(cls) -> S3Access:
        environ = os.environ.get
        return cls(
            endpoint=environ("AWS_ENDPOINT_URL_S3") or environ("AWS_ENDPOINT_URL"),
            region=environ("AWS_REGION") or environ("AWS_DEFAULT_REGION"),
            key_id=environ("AWS_ACCESS_KEY_ID"),
            secret=environ("AWS_SECRET_ACCESS_KEY"),
            token=environ("AWS_SESSION_TOKEN"),
        )


@functools.lru_cache(maxsize=8)
def _bucket_backend(bucket: str, access: S3Access) -> Any:
    """The artifact store's S3 backend on the whole bucket (one boto3 client per bucket and
    access): its conditional writes are the run records' too."""
    import boto3
    from botocore.config import Config

    from pipeline.artifacts.backends.s3 import S3Backend

    client = boto3.session.Session().client(
        "s3",
        endpoint_url=access.endpoint,
        region_name=access.region,
        aws_access_key_id=access.key_id,
        aws_secret_access_key=access.secret,
        aws_session_token=access.token,
        config=Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=16),
    )
    return S3Backend(S3Root(bucket), lock_timeout=2 * LOCK_LEASE_S, client=client)


def running(holder: Holder) -> str:
    """Why a run that ``holder`` holds cannot be used, and what to do."""
    return (
        f"it is running: process {holder} holds its {LOCK_FILE}; wait for that run to end or "
        "stop it first"
    )


def _exists_already(where: Path | str) -> str:
    return (
        f"{where} exists already; a new run needs a new directory (resume that one with "
        "--resume, or remove it)"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
