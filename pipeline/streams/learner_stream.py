"""Repeatable per-learner streams: ``split_for_learners`` once, then ``take(num_iters)``.

The learners of one ``split_for_learners`` call form a group. One producer thread per
group runs the group's source (Ray Data super-batches, or task samples), collates ahead
and deals every learner the same number of batches through a small bounded queue of its
own, so reading, shuffling and collating overlap with the learners' compute; ``take``
only finalizes (moves to the device) what it hands out. A position counts batches
*handed out*: batches prepared but never taken are neither lost nor counted.

A learner that stops taking batches fills its queue and stops the producer, so the
others wait. A waiting learner consults the group's ``ProgressBoard`` and, after
``stall_timeout_s``, raises ``StreamStalledError`` naming the learner that stopped,
instead of hanging.
"""

from __future__ import annotations

import contextlib
import queue
import time
import weakref
from collections import deque
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from pipeline.rows.feed import EpochSource, row_source
from pipeline.streams.collate import Batch, finalize
from pipeline.streams.group import StreamGroup
from pipeline.streams.stall import StreamStalledError
from pipeline.tasks.feed import TaskSource, WindowTaskSource
from pipeline.tasks.samples import TaskSamples
from pipeline.tasks.windows import TaskWindows

if TYPE_CHECKING:
    import ray.data

    from pipeline.reads.episodes import Episodes

__all__ = ["LearnerStream", "StreamStalledError", "split_for_learners"]

_PREFETCH_DEALS = 2


class LearnerStream:
    """One learner's endless, epoch-by-epoch stream of minibatches (or meta-batches).

    Build it with ``split_for_learners``. ``take(n)`` yields exactly ``n`` batches on
    ``device``; the next ``take`` continues where the last stopped, crossing into the
    next epoch (reshuffled with ``seed + epoch``) when one ends.
    """

    def __init__(self, *, name: str, rank: int, group: StreamGroup) -> None:
        self.name = name
        self.rank = rank
        self._group = group
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue(maxsize=_PREFETCH_DEALS)
        self._pending: deque[Batch] = deque()
        self._live_take: object | None = None
        self._failure: BaseException | None = None
        self._closed = False
        self._epoch = 0
        self._consumed = 0
        self._discard = 0
        self._batches = 0
        self._epochs_completed = 0
        self._dropped_rows = 0
        self._wait_s = 0.0
        self._first_take: float | None = None
        self._poll_s = min(0.1, group.board.timeout_s / 4)

    def take(self, num_iters: int) -> Iterator[Batch]:
        """Yield exactly ``num_iters`` batches, finalized to the stream's device.

        One generator at a time: a second ``take`` while one is live is refused, since
        two generators would silently share (and split) the same batches.
        """
        if isinstance(num_iters, bool) or not isinstance(num_iters, int) or num_iters < 0:
            raise ValueError(f"{self.name}: num_iters must be an int >= 0, got {num_iters!r}")
        self._check_usable()
        if self._live_take is not None:
            raise RuntimeError(
                f"{self.name}: a take() generator is still live; exhaust it or call its "
                "close() before calling take() again (two generators on one stream would "
                "share its batches)"
            )
        self._group.start()
        self._group.board.active(self.name)
        token = object()
        self._live_take = token
        generator = self._generate(num_iters, token)
        # A generator dropped before its first next() never runs its finally clause.
        weakref.finalize(generator, self._release_take, token)
        return generator

    def state(self) -> dict[str, Any]:
        """Position in the stream (JSON-safe): the epoch and the batches taken in it."""
        return {
            "learner": self.name,
            "rank": self.rank,
            **self._group.settings,
            "epoch": self._epoch,
            "batches_consumed": self._consumed,
            "exact": self._group.source.exact,
        }

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continue from ``state`` (from ``state()``), before the group's first ``take``.

        Exact (the same batches as an uninterrupted run) for row streams read from a
        dataset and for task samples; restore every learner of the group.
        """
        self._check_usable()
        if self._group.started:
            raise RuntimeError(
                f"{self.name}: restore() must come before the first take() of any learner "
                "of its split; build fresh streams with split_for_learners to resume"
            )
        expected = {"rank": self.rank, **self._group.settings}
        for key, value in expected.items():
            if key not in state:
                raise ValueError(f"{self.name}: state has no {key!r}; expected state() output")
            if state[key] != value:
                raise ValueError(
                    f"{self.name}: state was saved with {key}={state[key]!r} but this stream "
                    f"has {key}={value!r}; build the streams with the saved settings"
                )
        epoch, consumed = state["epoch"], state["batches_consumed"]
        if not all(isinstance(v, int) and v >= 0 for v in (epoch, consumed)):
            raise ValueError(f"{self.name}: state needs a non-negative epoch and batch count")
        self._epoch, self._consumed = epoch, consumed

    def stats(self) -> dict[str, Any]:
        """Counters for progress logs; ``rows_per_s`` counts from the first ``take``.

        ``dropped_rows`` counts the rows (transitions) that no learner of the split got
        in the epochs completed so far: the same number on every learner.
        """
        rows = self._batches * self._group.rows_per_batch
        elapsed = time.monotonic() - self._first_take if self._first_take else 0.0
        # Sources with counters of their own (windows of task samples) add them.
        source_stats = getattr(self._group.source, "stats", dict)
        return {
            "learner": self.name,
            "epoch": self._epoch,
            "batches": self._batches,
            "rows": rows,
            "epochs_completed": self._epochs_completed,
            "dropped_rows": self._dropped_rows,
            "wait_s": round(self._wait_s, 3),
            "rows_per_s": rows / elapsed if elapsed > 0 else 0.0,
            **source_stats(),
        }

    def close(self) -> None:
        """Stop taking batches; the last learner of a split to close stops its producer
        thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._group.release(self)

    def __enter__(self) -> LearnerStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LearnerStream({self.name!r}, epoch={self._epoch}, batch={self._consumed})"

    def _generate(self, num_iters: int, token: object) -> Iterator[Batch]:
        try:
            if self._first_take is None:
                self._first_take = time.monotonic()
            device = self._group.device
            for _ in range(num_iters):
                batch = self._next_batch()
                # Collate already made CPU tensors: nothing to move on a CPU learner.
                yield batch if device.type == "cpu" else finalize(batch, device)
        finally:
            self._release_take(token)

    def _release_take(self, token: object) -> None:
        if self._live_take is token:
            self._live_take = None

    def _next_batch(self) -> Batch:
        while not self._pending:
            item = self._next_item()
            if item[0] == "batches":
                # After a restore, this learner may be ahead of the group's slowest one.
                skipped = min(self._discard, len(item[1]))
                self._discard -= skipped
                self._pending.extend(item[1][skipped:])
            elif item[0] == "end":
                self._epoch += 1
                self._consumed = 0
                self._epochs_completed += 1
                self._dropped_rows += item[1]
            else:
                self._failure = item[1]
                raise self._failure
        self._consumed += 1
        self._batches += 1
        self._group.board.active(self.name)
        return self._pending.popleft()

    def _next_item(self) -> tuple[Any, ...]:
        self._check_usable()
        board = self._group.board
        try:
            # Once another learner gave up on this split, this one stops too.
            board.check(self.name)
        except StreamStalledError as error:
            self._failure = error
            raise
        with contextlib.suppress(queue.Empty):
            return self._queue.get_nowait()
        started = time.monotonic()
        board.start_wait(self.name)
        try:
            while True:
                board.check(self.name)
                with contextlib.suppress(queue.Empty):
                    return self._queue.get(timeout=self._poll_s)
        except StreamStalledError as error:
            self._failure = error
            raise
        finally:
            board.end_wait(self.name)
            self._wait_s += time.monotonic() - started

    def _check_usable(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self.name}: the stream is closed")
        if self._failure is not None:
            raise self._failure


def split_for_learners(
    source: Episodes | TaskSamples | TaskWindows | ray.data.DataIterator,
    num_learners: int,
    *,
    minibatch_size: int,
    seed: int = 0,
    superbatch_rows: int = 16384,
    columns: Sequence[str] | None = None,
    modules_to_update: Collection[str] | None = None,
    device: torch.device | str = "cpu",
    stall_timeout_s: float = 60.0,
    materialize: bool = False,
    ranks: Sequence[int] | None = None,
    gamma: float | None = None,
    cache_budget_mb: float | None = None,
) -> list[LearnerStream]:
    """Split ``source`` once into one repeatable stream per learner.

    ``source`` is ``Episodes`` (row minibatches of ``minibatch_size`` rows), the result
    of ``task_samples`` (meta-batches of ``minibatch_size`` tasks per learner, in memory
    or read window by window), or a Ray
    ``DataIterator`` that is already one learner's shard (Ray Train's
    ``get_dataset_shard``; ``num_learners=1``). Row streams fetch ``superbatch_rows`` rows
    per Ray Data batch (rounded down to whole minibatches), shuffle the file order (the
    block order when materialized) and the rows inside each super-batch with
    ``seed + epoch``, and deal minibatches to the learners in turn.

    Row streams keep the first epoch read to its end in memory and serve later epochs from
    it, with the same batches a re-read gives, when the selected columns take at most
    ``cache_budget_mb`` MiB (default: a quarter of Ray's object store; 0: read every epoch
    from the files, two windows of files in memory at most). ``materialize`` reads the
    selected columns once, now, into Ray's object store (which spills to disk when full).
    ``stall_timeout_s`` bounds how long a learner waits for data that a stopped learner
    holds up before ``StreamStalledError``. ``ranks`` builds only those learners' streams
    (a Ray Train worker passes its own rank): task samples only. ``gamma`` adds the
    columns derived at ingest to row minibatches (``returns``, ``returns_truncated``; see
    ``pipeline.reads.returns``); task samples take it in ``task_samples``.
    """
    _check_int("num_learners", num_learners, 1)
    _check_int("minibatch_size", minibatch_size, 1)
    _check_int("seed", seed, 0)
    _check_int("superbatch_rows", superbatch_rows, 1)
    if stall_timeout_s <= 0:
        raise ValueError(f"stall_timeout_s must be > 0 seconds, got {stall_timeout_s}")
    if cache_budget_mb is not None and not cache_budget_mb >= 0:
        raise ValueError(
            f"cache_budget_mb must be >= 0 MiB (0 reads every epoch from the files) or None "
            f"(a quarter of Ray's object store), got {cache_budget_mb!r}"
        )
    device = torch.device(device)
    ranks = list(range(num_learners)) if ranks is None else list(ranks)
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < num_learners for r in ranks):
        raise ValueError(f"ranks must be distinct learners in [0, {num_learners}), got {ranks}")
    source_of_batches: EpochSource
    extra_settings: dict[str, Any] = {}
    if isinstance(source, TaskSamples | TaskWindows):
        given = (columns, modules_to_update, gamma)
        if any(value is not None for value in given) or materialize or cache_budget_mb is not None:
            raise ValueError(
                "task samples come with their columns, modules_to_update and gamma chosen "
                "by task_samples(); pass those there, and no materialize= or cache_budget_mb="
            )
        windowed = isinstance(source, TaskWindows)
        source_of_batches = (WindowTaskSource if windowed else TaskSource)(
            source,
            tasks_per_batch=minibatch_size,
            seed=seed,
            ranks=ranks,
            num_learners=num_learners,
            pin_memory=device.type == "cuda",
        )
        kind, rows_per_batch = "tasks", minibatch_size * (source.support + source.query)
        if windowed:
            # Another window size gives other batches: a state resumes only the same one.
            kind, extra_settings = "task_windows", {"window_rows": source.window_rows}
    else:
        if len(ranks) != num_learners:
            raise ValueError(
                "ranks= works for task samples only: row streams of one split are dealt "
                "from one read, so they are built together (a Ray Train worker passes its "
                "dataset shard as the source, with num_learners=1)"
            )
        source_of_batches = row_source(
            source,
            num_learners,
            minibatch_size=minibatch_size,
            seed=seed,
            superbatch_rows=superbatch_rows,
            columns=columns,
            modules_to_update=modules_to_update,
            materialize=materialize,
            pin_memory=device.type == "cuda",
            gamma=gamma,
            cache_budget_mb=cache_budget_mb,
        )
        kind, rows_per_batch = "rows", minibatch_size
    group = StreamGroup(
        source=source_of_batches,
        ranks=ranks,
        settings={
            "kind": kind,
            "num_learners": num_learners,
            "seed": seed,
            "minibatch_size": minibatch_size,
            **extra_settings,
        },
        rows_per_batch=rows_per_batch,
        device=device,
        stall_timeout_s=stall_timeout_s,
        make_stream=LearnerStream,
    )
    return group.streams


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
