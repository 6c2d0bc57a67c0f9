"""Training progress: one log line per logged iteration, and a Prefect progress artifact.

A line reads::

    iteration 400/2000 (20%) | 312.4 it/s | 62.5k rows/s | ETA 5s | query_loss 0.00184 |
    support_loss 0.00312 -> 0.00201

Rates count from the first iteration of this attempt (a resumed attempt does not claim
the speed of the iterations it skipped).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any
from uuid import UUID


class TrainingProgress:
    """``on_log`` callback of ``learners.training.loop.run_meta_training``.

    With ``artifact_key`` it also keeps a Prefect progress artifact (0-100 %) up to date;
    that needs a Prefect run context. The artifact is best-effort: if the Prefect API
    refuses an update, one warning is logged and training goes on without it.
    """

    def __init__(
        self,
        *,
        total: int,
        start: int,
        rows_per_iteration: int,
        logger: logging.Logger | logging.LoggerAdapter,
        artifact_key: str | None = None,
    ) -> None:
        self.total = total
        self.start = start
        self.rows_per_iteration = rows_per_iteration
        self.logger = logger
        self._artifact_key = artifact_key
        self._artifact_id: UUID | None = None
        self._began = time.monotonic()
        self.last_line = ""

    def begin(self) -> None:
        """Log the starting point and create the progress artifact."""
        self._began = time.monotonic()
        if self.start:
            self.logger.info(
                "resuming at iteration %d/%d from the last checkpoint", self.start, self.total
            )
        if self._artifact_key is not None:
            self._artifact(100.0 * self.start / self.total)

    def __call__(self, iteration: int, metrics: Mapping[str, Any]) -> None:
        elapsed = max(time.monotonic() - self._began, 1e-9)
        done = iteration - self.start
        rate = done / elapsed
        eta = (self.total - iteration) / rate if rate > 0 else float("inf")
        parts = [
            f"iteration {iteration}/{self.total} ({100 * iteration / self.total:.0f}%)",
            f"{rate:.1f} it/s",
            f"{_si(rate * self.rows_per_iteration)} rows/s",
            f"ETA {_duration(eta)}",
        ]
        if "query_loss" in metrics:
            parts.append(f"query_loss {float(metrics['query_loss']):.4g}")
        if "support_loss_before" in metrics and "support_loss_after" in metrics:
            parts.append(
                f"support_loss {float(metrics['support_loss_before']):.4g} -> "
                f"{float(metrics['support_loss_after']):.4g}"
            )
        self.last_line = " | ".join(parts)
        self.logger.info("%s", self.last_line)
        if self._artifact_key is not None:
            self._artifact(100.0 * iteration / self.total)

    def _artifact(self, percent: float) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        try:
            if self._artifact_id is None:
                self._artifact_id = create_progress_artifact(
                    progress=percent,
                    key=self._artifact_key,
                    description=f"meta-training iterations done (of {self.total})",
                )
            else:
                update_progress_artifact(self._artifact_id, progress=percent)
        except Exception as error:  # the artifact is a view; training does not depend on it
            self.logger.warning("progress artifact disabled: the Prefect API said %s", error)
            self._artifact_key = None


def _si(value: float) -> str:
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.1f}{suffix}"
    return f"{value:.0f}"


def _duration(seconds: float) -> str:
    if seconds == float("inf"):
        return "?"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"
