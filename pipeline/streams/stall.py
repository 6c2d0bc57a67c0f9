"""Stall detection for learners that share one read of the data.

The learners of a split are fed by one producer: a learner that stops taking batches
fills its queue, the producer waits for it, and the others run dry. Instead of hanging,
each waiting learner consults a board shared by its group and, once it has waited longer
than the timeout, fails naming the learner(s) that stopped. The board lives in one
process: a learner fed by another process (a Ray Train shard) that waits too long is
reported as a stalled data source.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence


class StreamStalledError(RuntimeError):
    """A learner waited longer than ``stall_timeout_s`` for data because another learner
    (or the data source) stopped; the message names who stalled."""


class ProgressBoard:
    """When each learner of a group last took a batch, and whether it is waiting now.

    A learner is *stalled* when it is not waiting inside ``take()`` and has not taken a
    batch for longer than the timeout. Once one learner has failed, the board stays
    failed and every learner of the group gets the same error on its next wait.
    """

    def __init__(self, names: Sequence[str], timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError(f"stall_timeout_s must be > 0 seconds, got {timeout_s}")
        now = time.monotonic()
        self.timeout_s = float(timeout_s)
        self._lock = threading.Lock()
        self._names = tuple(names)
        self._last_active = dict.fromkeys(self._names, now)
        self._waiting_since: dict[str, float | None] = dict.fromkeys(self._names)
        self._closed: set[str] = set()
        self._failure: StreamStalledError | None = None

    def active(self, name: str) -> None:
        """``name`` took a batch (or called ``take()``) just now."""
        with self._lock:
            self._last_active[name] = time.monotonic()

    def closed(self, name: str) -> None:
        """``name`` closed its stream: it will never take another batch."""
        with self._lock:
            self._closed.add(name)
            self._waiting_since[name] = None

    def start_wait(self, name: str) -> None:
        with self._lock:
            self._waiting_since[name] = time.monotonic()

    def end_wait(self, name: str) -> None:
        with self._lock:
            self._waiting_since[name] = None
            self._last_active[name] = time.monotonic()

    def check(self, name: str) -> None:
        """Raise ``StreamStalledError`` if the group failed or ``name`` waited too long
        because of a stalled learner or a silent data source."""
        with self._lock:
            if self._failure is not None:
                raise self._failure
            now = time.monotonic()
            since = self._waiting_since[name]
            if since is None or now - since <= self.timeout_s:
                return
            stalled = [
                other
                for other in self._names
                if self._waiting_since[other] is None
                and now - self._last_active[other] > self.timeout_s
            ]
            waiting = [other for other in self._names if self._waiting_since[other] is not None]
            if stalled:
                self._failure = StreamStalledError(self._stalled_message(name, stalled, now))
            elif all(now - self._waiting_since[other] > self.timeout_s for other in waiting) and (
                len(waiting) == len(self._names)
            ):
                self._failure = StreamStalledError(self._silent_source_message(now))
            else:
                # Another learner is still taking batches (it may be finishing its epoch
                # before the barrier): waiting on it is progress, not a stall.
                return
            raise self._failure

    def fail(self, error: StreamStalledError) -> None:
        with self._lock:
            if self._failure is None:
                self._failure = error

    def _stalled_message(self, name: str, stalled: list[str], now: float) -> str:
        idle = ", ".join(
            f"{other} (closed its stream)"
            if other in self._closed
            else f"{other} ({now - self._last_active[other]:.1f} s)"
            for other in stalled
        )
        return (
            f"learner stream stalled: {idle} took no batch for longer than "
            f"stall_timeout_s={self.timeout_s:g} s, and {name} waited "
            f"{now - (self._waiting_since[name] or now):.1f} s for data it cannot get "
            "until every learner of the split keeps consuming. Every learner must call "
            "take() at the same pace; close() the streams of learners that stop, or raise "
            "stall_timeout_s if a learner legitimately pauses this long."
        )

    def _silent_source_message(self, now: float) -> str:
        waits = ", ".join(
            f"{other} ({now - (self._waiting_since[other] or now):.1f} s)" for other in self._names
        )
        return (
            f"data source stalled: every learner waited longer than stall_timeout_s="
            f"{self.timeout_s:g} s for a batch: {waits}. Ray Data produced nothing in that "
            "time; check the cluster's resources and the dataset's files, or raise "
            "stall_timeout_s for very slow storage."
        )
