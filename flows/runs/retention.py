"""Old run directories go: a run's result lives on in the artifact store, its checkpoints
only matter while it may be resumed.

``prune_runs`` (called when a run starts) removes the finished runs beyond the newest
``training.keep_runs`` and the unfinished ones untouched for ``training.keep_unfinished_days``.
A run some live process holds is never removed; one being removed is held first, so a resume
cannot start in it meanwhile, then renamed to a dot-name (no longer a run) and deleted.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from flows.runs.run_dirs import RUN_FILE, RunDirError, hold, list_runs

_REMOVING = ".removing-"
_DAY_S = 86400


def prune_runs(
    root: str | os.PathLike[str],
    *,
    keep_finished: int,
    keep_unfinished_days: float,
    now: float | None = None,
) -> list[Path]:
    """Remove the finished runs under ``root`` older than the newest ``keep_finished`` and
    the unfinished runs untouched for more than ``keep_unfinished_days``; returns the
    directories removed."""
    root = Path(root)
    now = time.time() if now is None else now
    records = list_runs(root)
    finished = sorted(
        (record for record in records if record.finished is not None),
        key=lambda record: record.finished["finished_at"],
        reverse=True,
    )
    stale = [
        record
        for record in records
        if record.finished is None
        and now - _last_active(record.path) > keep_unfinished_days * _DAY_S
    ]
    removed = []
    for record in finished[keep_finished:] + stale:
        try:
            with hold(record.path):
                record.path.rename(root / f"{_REMOVING}{record.path.name}")
        except RunDirError:
            continue
        removed.append(record.path)
    # Also what an interrupted earlier removal left behind.
    for doomed in root.glob(f"{_REMOVING}*"):
        shutil.rmtree(doomed, ignore_errors=True)
    return removed


def _last_active(path: Path) -> float:
    """The newest modification time of the run directory's run.json and of its directories
    down to two levels (each checkpoint adds an entry to one of them)."""
    newest = (path / RUN_FILE).stat().st_mtime
    for directory, subdirectories, _ in os.walk(path):
        newest = max(newest, os.stat(directory).st_mtime)
        if len(Path(directory).relative_to(path).parts) >= 2:
            subdirectories.clear()
    return newest
