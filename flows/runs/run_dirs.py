"""Run directories: one per meta-training run under ``training.checkpoint_dir`` (the runs
root, a local directory or ``s3://bucket/prefix``: ``flows.runs.run_storage``), recording
what the run trains, so that a killed run can be found and resumed and old runs pruned.

    <checkpoint_dir>/<run id>/     the id of the flow run that started the run
        run.json        the config, its identity, one entry per start (flow run id, time)
        run.lock        held by the process running the run (flock locally; on S3 an
                        object written conditionally and renewed, ``run_storage``)
        checkpoints/    in-process checkpoints (ray/: Ray Train's)
        finished.json   written once the version is published: the run is done

A run is *live* while a process holds its lock and *unfinished* until finished.json exists.
Entries of the runs root whose names start with a dot are not runs (``flows.runs.retention``
renames a run so before removing it).
``offmeta run --resume`` continues the newest unfinished run that is not live and has the
same config identity: the sha256 of the config as canonical JSON without the fields that
only say how to run it (``IDENTITY_EXCLUDES``), so the same identity means the same result.
A run's identity is that of the config it recorded *as this offmeta resolves it*: the
recorded values, read by today's ``MetaTrainConfig``, so a field a later release added takes
its default, which by design is what the earlier release did. A run started by an earlier
offmeta therefore resumes when its effective config is the same; otherwise the refusal names
the fields that differ, or that this release no longer reads. The ``identity`` written in
``run.json`` is the one its writer computed, for people; resuming never compares it.

Nothing here imports Prefect, Ray or torch: the CLI finds the run to resume before paying
for them.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from flows.config import MetaTrainConfig
from flows.runs.run_storage import (
    FINISHED_FILE,
    LOCK_FILE,
    RUN_FILE,
    RunDir,
    RunDirError,
    run_at,
    running,
    runs_root,
)

__all__ = [
    "FINISHED_FILE",
    "IDENTITY_EXCLUDES",
    "LOCK_FILE",
    "RUN_FILE",
    "ActiveRun",
    "RunDirError",
    "RunRecord",
    "abandoned_flow_runs",
    "check_resumable",
    "config_identity",
    "find_resumable",
    "hold",
    "list_runs",
    "live_pid",
    "open_run",
    "read_run",
]

FORMAT = 1
IDENTITY_EXCLUDES = {
    "learners": ("check_vectorized",),
    "training": (
        "checkpoint_dir",
        "keep_checkpoints",
        "keep_runs",
        "keep_unfinished_days",
        "retries",
        "retry_delay_s",
        "shared_filesystem",
    ),
}
"""Config fields left out of a run's identity: where runs live, how many are kept, retries,
and a check that changes no result."""
_SHOWN_DIFFERENCES = 5


@dataclass(frozen=True)
class RunRecord:
    """What ``run.json`` (and ``finished.json``, once written) say about one run."""

    path: Path | str
    """The run directory, or its ``s3://`` URI."""
    artifact: str
    identity: str
    """The identity its writer computed (an earlier release knew fewer fields): for people."""
    config: dict[str, Any]
    """The config as its writer dumped it."""
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
    """The record of the run directory ``path`` (a directory or an ``s3://`` URI);
    ``RunDirError`` if it is not one."""
    return _read(run_at(path))


def _read(run: RunDir) -> RunRecord:
    path = run.where
    if not run.exists():
        raise RunDirError(f"{path}: no such run directory")
    where = _inside(path, RUN_FILE)
    try:
        content = run.read(RUN_FILE)
        document = json.loads(content) if content is not None else None
    except (OSError, ValueError) as error:
        raise RunDirError(f"{where} is unreadable: {error}") from None
    if content is None:
        raise RunDirError(
            f"{path} is not an offmeta run directory (it has no {RUN_FILE}); expected a "
            "directory under training.checkpoint_dir, e.g. runs/<flow run id>"
        )
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else document
        raise RunDirError(f"{where}: format {found!r}, expected {FORMAT}")
    finished = run.read(FINISHED_FILE)
    return RunRecord(
        path=path,
        artifact=document["artifact"],
        identity=document["identity"],
        config=document["config"],
        starts=tuple(document["starts"]),
        finished=json.loads(finished) if finished is not None else None,
    )


def list_runs(root: str | os.PathLike[str]) -> list[RunRecord]:
    """Every readable run directory under ``root``; other entries are left out."""
    runs = runs_root(root)
    records = []
    for name in runs.names():
        with contextlib.suppress(RunDirError):
            records.append(_read(runs.run(name)))
    return records


def live_pid(path: str | os.PathLike[str]) -> int | None:
    """The process holding the run directory's lock (0 if it wrote no pid); None if none."""
    holder = run_at(path).holder()
    return holder.pid if holder is not None else None


def find_resumable(cfg: MetaTrainConfig) -> Path | str:
    """The newest unfinished, not live run under ``training.checkpoint_dir`` with the
    identity of ``cfg``; ``RunDirError`` naming the runs it looked at when there is none."""
    root = runs_root(cfg.training.checkpoint_dir).where
    unfinished = [
        record
        for record in list_runs(root)
        if record.finished is None and record.artifact == cfg.artifacts.name
    ]
    resumable = [
        record
        for record in unfinished
        if not _config_problem(record, cfg) and live_pid(record.path) is None
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
    holder = run_at(record.path).holder()
    if holder is not None:
        raise RunDirError(f"{record.path}: {running(holder)}")


class ActiveRun:
    """The run directory this process holds (``open_run``)."""

    def __init__(self, run: RunDir, earlier_flow_runs: list[str]) -> None:
        self._run = run
        self.path = run.where
        """The run directory, or its ``s3://`` URI."""
        self.run_id = run.name
        self.earlier_flow_runs = earlier_flow_runs
        """Flow runs that worked on this run before (none for a new run)."""

    def finish(self, artifact: str, uri: str) -> None:
        """Mark the run finished, having published ``artifact``."""
        self._run.write_once(
            FINISHED_FILE, _json({"artifact": artifact, "uri": uri, "finished_at": _now()})
        )


@contextlib.contextmanager
def hold(path: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the run directory's lock for the ``with`` block; ``RunDirError`` if a live
    process holds it."""
    with run_at(path).hold():
        yield


@contextlib.contextmanager
def open_run(
    cfg: MetaTrainConfig, *, resume: str | os.PathLike[str] | None, flow_run_id: str | None
) -> Iterator[ActiveRun]:
    """Hold a run directory for the ``with`` block: a new one named after ``flow_run_id``
    under ``training.checkpoint_dir``, or the unfinished run ``resume``, checked again
    under its lock. Either way the start is recorded in ``run.json``."""
    if resume is None:
        run = runs_root(cfg.training.checkpoint_dir).create(flow_run_id or uuid.uuid4().hex)
    else:
        run = run_at(read_run(resume).path)
    with run.hold():
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
            record = _read(run)
            _check_config(record, cfg)
            earlier = record.flow_run_ids()
            document = json.loads(run.read(RUN_FILE) or b"null")
        document["starts"].append({"flow_run_id": flow_run_id, "started_at": _now()})
        run.replace(RUN_FILE, _json(document))
        yield ActiveRun(run, earlier)


def abandoned_flow_runs(root: str | os.PathLike[str]) -> list[tuple[str, Path | str]]:
    """``(flow run id, run directory)`` of every start of every unfinished run under ``root``
    that no live process holds: those flow runs ended without finishing their run."""
    return [
        (flow_run_id, record.path)
        for record in list_runs(root)
        if record.finished is None and run_at(record.path).holder() is None
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
    holder = run_at(record.path).holder()
    return _config_problem(record, cfg) or (running(holder) if holder is not None else "")


def _config_problem(record: RunRecord, cfg: MetaTrainConfig) -> str:
    if record.artifact != cfg.artifacts.name:
        return (
            f"it publishes {record.artifact!r}, not {cfg.artifacts.name!r}; resume it with its "
            "own config"
        )
    try:
        recorded = MetaTrainConfig.model_validate(record.config)
    except ValidationError as error:
        return (
            "it was started by an offmeta whose config this one reads differently: "
            f"{_unread(error)}; resume it with the offmeta that started it or start a new run"
        )
    if config_identity(recorded) != config_identity(cfg):
        return (
            f"it was started with another config, which differs in "
            f"{_differences(recorded, cfg)}; resume it with that config or start a new run"
        )
    return ""


def _unread(error: ValidationError) -> str:
    """The recorded fields this release refuses, each with its recorded value."""
    fields = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "<config>"
        now = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            now = "no such field"
        run = "absent" if item["type"] == "missing" else json.dumps(item["input"])
        fields.append(f"{where} (run: {run}, now: {now})")
    return _first_few(fields)


def _identity_document(cfg: MetaTrainConfig | Mapping[str, Any]) -> dict[str, Any]:
    document = cfg.model_dump(mode="json") if isinstance(cfg, MetaTrainConfig) else dict(cfg)
    for section, names in IDENTITY_EXCLUDES.items():
        document[section] = {
            key: value for key, value in document.get(section, {}).items() if key not in names
        }
    return document


def _differences(recorded: MetaTrainConfig, cfg: MetaTrainConfig) -> str:
    before = _flatten(_identity_document(recorded))
    now = _flatten(_identity_document(cfg))
    keys = sorted(key for key in before.keys() | now.keys() if before.get(key) != now.get(key))
    return _first_few(
        [
            f"{key} (run: {json.dumps(before.get(key))}, now: {json.dumps(now.get(key))})"
            for key in keys
        ]
    )


def _first_few(fields: list[str]) -> str:
    """The first ``_SHOWN_DIFFERENCES`` of ``fields``, and how many more there are."""
    more = len(fields) - _SHOWN_DIFFERENCES
    return ", ".join(fields[:_SHOWN_DIFFERENCES]) + (f" and {more} more" if more > 0 else "")


def _flatten(document: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _json(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=1) + "\n").encode()


def _inside(where: Path | str, file: str) -> Path | str:
    return where / file if isinstance(where, Path) else f"{where}/{file}"


def _now() -> str:
    return datetime.now(UTC).isoformat()
