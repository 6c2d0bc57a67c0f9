"""Old run directories go: a run's result lives on in the artifact store, its checkpoints
only matter while it may be resumed.

``prune_runs`` (called when a run starts) removes the finished runs beyond the newest
``training.keep_runs`` and the unfinished ones untouched for ``training.keep_unfinished_days``.
A run some live process holds is never removed; one being removed is held first, so a resume
cannot start in it meanwhile, then stops being a run (a dot-name locally, a removal marker
on S3: ``flows.runs.run_storage``) and is deleted.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from flows.runs.run_dirs import list_runs
from flows.runs.run_storage import RunDirError, run_at, runs_root

_DAY_S = 86400


def prune_runs(
    root: str | os.PathLike[str],
    *,
    keep_finished: int,
    keep_unfinished_days: float,
    now: float | None = None,
) -> list[Path | str]:
    """Remove the finished runs under ``root`` older than the newest ``keep_finished`` and
    the unfinished runs untouched for more than ``keep_unfinished_days``; returns the
    directories (or ``s3://`` URIs) removed."""
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
        and now - run_at(record.path).last_active() > keep_unfinished_days * _DAY_S
    ]
    removed = []
    for record in finished[keep_finished:] + stale:
        run = run_at(record.path)
        try:
            with run.hold():
                run.remove()
        except RunDirError:
            continue
        removed.append(record.path)
    # Also what an interrupted earlier removal left behind.
    runs_root(root).sweep()
    return removed
