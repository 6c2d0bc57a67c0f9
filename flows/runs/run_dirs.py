"""Run directories: one per meta-training run under ``training.checkpoint_dir`` (the runs
root), recording what the run trains, so that a killed run can be found and resumed and old
runs pruned.

    <checkpoint_dir>/<run id>/     the id of the flow run that started the run
        run.json        the config, its identity, one entry per start (flow run id, time)
        run.lock        flock-ed by the process running the run; the kernel drops the lock
                        when that process dies, even by SIGKILL
        checkpoints/    in-process checkpoints (ray/: Ray Train's)
        finished.json   written once the version is published: the run is done

A run is *live* while a process holds its lock and *unfinished* until finished.json exists.
Entries of the runs root whose names start with a dot are not runs (``flows.runs.retention``
renames a run so before removing it).
``offmeta run --resume`` continues the newest unfinished run that is not live and has the
same config identity: the sha256 of the config as canonical JSON without the fields that
only say how to run it (``IDENTITY_EXCLUDES``), so the same identity means the same result.

Nothing here imports Prefect, Ray or torch: the CLI finds the run to resume before paying
for them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows.config import MetaTrainConfig
from pipeline.io.fsio import fsync_dir, write_file

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
FINISHED_FILE = "finished.json"
FORMAT = 1
IDENTITY_EXCLUDES = {
    "training": (
        "checkpoint_dir",
        "keep_checkpoints",
        "keep_runs",
        "keep_unfinished_days",
        "retries",
        "retry_delay_s",
    )
}
"""Config fields left out of a run's identity: where runs live, how many are kept, retries."""
_SHOWN_DIFFERENCES = 5


class RunDirError(ValueError):
    """A run directory cannot be used as asked; the message says why and what to do."""


@dataclass(frozen=True)
class RunRecord:
    """What ``run.json`` (and ``finished.json``, once written) say about one run."""

    path: Path
    artifact: str
    identity: str
    config: dict[str, Any]
    starts: tuple[dict[str, Any], ...]
    """One ``{"flow_run_id", "started_at"}`` per start, the first one first."""
    finished: dict[str, Any] | None

    @property
    def last_started(self) -> datetime:
        return datetime.fromisoformat(self.starts[-1]["started_at"])

    def flow_run_ids(self) -> list[str]:
        return [start["flow_run_id"] for start in self.starts if start["flow_run_id"]]


def config_identity(cfg: MetaTrainConfig | Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the config's identity fields as canonical JSON."""
    canonical = json.dumps(_identity_document(cfg), sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def read_run(path: str | os.PathLike[str]) -> RunRecord:
    """The record of the run directory ``path``; ``RunDirError`` if it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path}: no such run directory")
    try:
        document = json.loads((path / RUN_FILE).read_text())
    except FileNotFoundError:
        raise RunDirError(
            f"{path} is not an offmeta run directory (it has no {RUN_FILE}); expected a "
            "directory under training.checkpoint_dir, e.g. runs/<flow run id>"
        ) from None
    except (OSError, ValueError) as error:
        raise RunDirError(f"{path / RUN_FILE} is unreadable: {error}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else document
        raise RunDirError(f"{path / RUN_FILE}: format {found!r}, expected {FORMAT}")
    finished = None
    with contextlib.suppress(FileNotFoundError):
        finished = json.loads((path / FINISHED_FILE).read_text())
    return RunRecord(
        path=path,
        artifact=document["artifact"],
        identity=document["identity"],
        config=document["config"],
        starts=tuple(document["starts"]),
        finished=finished,
    )


def list_runs(root: str | os.PathLike[str]) -> list[RunRecord]:
    """Every readable run directory under ``root``; other entries are left out."""
    try:
        entries = sorted(Path(root).iterdir())
    except FileNotFoundError:
        return []
    records = []
    for entry in entries:
        if entry.name.startswith(".") or not (entry / RUN_FILE).is_file():
            continue
        with contextlib.suppress(RunDirError):
            records.append(read_run(entry))
    return records


def live_pid(path: Path) -> int | None:
    """The process holding the run directory's lock (0 if it wrote no pid); None if none."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        return _holder(fd)
    finally:
        os.close(fd)


def find_resumable(cfg: MetaTrainConfig) -> Path:
    """The newest unfinished, not live run under ``training.checkpoint_dir`` with the
    identity of ``cfg``; ``RunDirError`` naming the runs it looked at when there is none."""
    root = Path(cfg.training.checkpoint_dir)
    identity = config_identity(cfg)
    unfinished = [
        record
        for record in list_runs(root)
        if record.finished is None and record.artifact == cfg.artifacts.name
    ]
    resumable = [
        record
        for record in unfinished
        if record.identity == identity and live_pid(record.path) is None
    ]
    if resumable:
        return max(resumable, key=lambda record: record.last_started).path
    seen = [f"{record.path}: {_why_not(record, cfg)}" for record in unfinished]
    listed = f" (unfinished runs of that name: {'; '.join(seen)})" if seen else ""
    raise RunDirError(
        f"no unfinished run of {cfg.artifacts.name!r} with this config under {root}{listed}; "
        "run without --resume to start a new run, or name a run directory with "
        "--resume RUN_DIR"
    )


def check_resumable(record: RunRecord, cfg: MetaTrainConfig) -> None:
    """``RunDirError`` unless the run of ``record`` can be resumed with ``cfg`` now."""
    _check_config(record, cfg)
    pid = live_pid(record.path)
    if pid is not None:
        raise RunDirError(f"{record.path}: {_running(pid)}")


class ActiveRun:
    """The run directory this process holds (``open_run``)."""

    def __init__(self, record: RunRecord, earlier_flow_runs: list[str]) -> None:
        self.path = record.path
        self.run_id = record.path.name
        self.earlier_flow_runs = earlier_flow_runs
        """Flow runs that worked on this run before (none for a new run)."""

    def finish(self, artifact: str, uri: str) -> None:
        """Mark the run finished, having published ``artifact``."""
        _write_json(
            self.path / FINISHED_FILE,
            {"artifact": artifact, "uri": uri, "finished_at": _now()},
        )


@contextlib.contextmanager
def hold(path: Path) -> Iterator[None]:
    """Hold the run directory's lock for the ``with`` block; ``RunDirError`` if a live
    process holds it."""
    fd = _lock(path)
    try:
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_run(
    cfg: MetaTrainConfig, *, resume: str | os.PathLike[str] | None, flow_run_id: str | None
) -> Iterator[ActiveRun]:
    """Hold a run directory for the ``with`` block: a new one named after ``flow_run_id``
    under ``training.checkpoint_dir``, or the unfinished run ``resume``, checked again
    under its lock. Either way the start is recorded in ``run.json``."""
    if resume is None:
        path = Path(cfg.training.checkpoint_dir) / (flow_run_id or uuid.uuid4().hex)
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            raise RunDirError(
                f"{path} exists already; a new run needs a new directory (resume that one "
                "with --resume, or remove it)"
            ) from None
    else:
        path = read_run(resume).path
    with hold(path):
        if resume is None:
            earlier: list[str] = []
            document = {
                "format": FORMAT,
                "artifact": cfg.artifacts.name,
                "identity": config_identity(cfg),
                "config": cfg.model_dump(mode="json"),
                "starts": [],
            }
        else:
            record = read_run(path)
            _check_config(record, cfg)
            earlier = record.flow_run_ids()
            document = json.loads((path / RUN_FILE).read_text())
        document["starts"].append({"flow_run_id": flow_run_id, "started_at": _now()})
        _write_json(path / RUN_FILE, document)
        yield ActiveRun(read_run(path), earlier)


def abandoned_flow_runs(root: str | os.PathLike[str]) -> list[tuple[str, Path]]:
    """``(flow run id, run directory)`` of every start of every unfinished run under ``root``
    that no live process holds: those flow runs ended without finishing their run."""
    return [
        (flow_run_id, record.path)
        for record in list_runs(root)
        if record.finished is None and live_pid(record.path) is None
        for flow_run_id in record.flow_run_ids()
    ]


def _check_config(record: RunRecord, cfg: MetaTrainConfig) -> None:
    """``RunDirError`` if the run of ``record`` finished or was started with another config."""
    if record.finished is not None:
        raise RunDirError(
            f"{record.path} finished at {record.finished['finished_at']} and published "
            f"{record.finished['artifact']}; nothing to resume. Run without --resume to start "
            "a new run"
        )
    problem = _config_problem(record, cfg)
    if problem:
        raise RunDirError(f"{record.path}: {problem}")


def _why_not(record: RunRecord, cfg: MetaTrainConfig) -> str:
    """Why the unfinished run of ``record`` cannot be resumed with ``cfg`` now."""
    pid = live_pid(record.path)
    return _config_problem(record, cfg) or (_running(pid) if pid is not None else "")


def _config_problem(record: RunRecord, cfg: MetaTrainConfig) -> str:
    if record.artifact != cfg.artifacts.name:
        return (
            f"it publishes {record.artifact!r}, not {cfg.artifacts.name!r}; resume it with its "
            "own config"
        )
    if record.identity != config_identity(cfg):
        return (
            f"it was started with another config, which differs in "
            f"{_differences(record.config, cfg)}; resume it with that config or start a new run"
        )
    return ""


def _running(pid: int) -> str:
    return (
        f"it is running: process {pid or '(unknown)'} holds its {LOCK_FILE}; wait for that "
        "run to end or stop it first"
    )


def _identity_document(cfg: MetaTrainConfig | Mapping[str, Any]) -> dict[str, Any]:
    document = cfg.model_dump(mode="json") if isinstance(cfg, MetaTrainConfig) else dict(cfg)
    for section, names in IDENTITY_EXCLUDES.items():
        document[section] = {
            key: value for key, value in document.get(section, {}).items() if key not in names
        }
    return document


def _differences(recorded: Mapping[str, Any], cfg: MetaTrainConfig) -> str:
    before = _flatten(_identity_document(recorded))
    now = _flatten(_identity_document(cfg))
    keys = sorted(key for key in before.keys() | now.keys() if before.get(key) != now.get(key))
    shown = [
        f"{key} (run: {json.dumps(before.get(key))}, now: {json.dumps(now.get(key))})"
        for key in keys[:_SHOWN_DIFFERENCES]
    ]
    more = f" and {len(keys) - _SHOWN_DIFFERENCES} more" if len(keys) > _SHOWN_DIFFERENCES else ""
    return ", ".join(shown) + more


def _flatten(document: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _lock(path: Path) -> int:
    """An open, exclusively flock-ed ``run.lock`` of ``path`` holding this process's pid."""
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:
        raise RunDirError(f"{path}: no such run directory (removed meanwhile?)") from None
    holder = _holder(fd)
    if holder is not None:
        os.close(fd)
        raise RunDirError(f"{path}: {_running(holder)}")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _holder(fd: int) -> int | None:
    """The pid written in the lock file ``fd`` that another open file holds (0: none
    written); None when it was free, and ``fd`` holds it now."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        content = os.pread(fd, 32, 0).decode(errors="replace").strip()
        return int(content) if content.isdigit() else 0
    return None


def _write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``document`` atomically and durably."""
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_file(staged, (json.dumps(document, indent=1) + "\n").encode(), durable=True)
    os.replace(staged, path)
    fsync_dir(path.parent)


def _now() -> str:
    return datetime.now(UTC).isoformat()
