"""Repeatable per-learner streams: ``split_for_learners`` once, then ``take(num_iters)``.

The learners of one ``split_for_learners`` call form a group. One producer thread per
group runs the group's feed (Ray Data super-batches, or task samples), collates ahead
and deals every learner the same number of batches through a small bounded queue of its
own, so reading, shuffling and collating overlap with the learners' compute; ``take``
only finalizes (moves to the device) what it hands out. A position counts batches
*handed out*: batches prepared but never taken are neither lost nor counted.

A learner that stops taking batches fills its queue and stops the producer, so the
others wait. A waiting learner consults the group's ``ProgressBoard`` and, after
``stall_timeout_s``, raises ``StreamStalledError`` naming the learner that stopped,
instead of hanging.

``split_for_learners`` takes what every stream has: the learners, the minibatch size,
the seed, the device and the stall timeout. An option that only one kind of data has
travels with that data, so that it cannot be given to another: row streams take theirs
in a ``RowStream`` (``pipeline.rows.options``: columns, modules, discount, super-batch
rows, materialisation, cache budget), task samples choose theirs in ``task_samples`` and
take the learners to build in a ``TaskStream`` (``pipeline.tasks.options``: ranks).
Passing ``Episodes``, a ``DataIterator`` or task samples as they are streams them with
the defaults.
"""

from __future__ import annotations

import contextlib
import queue
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from pipeline.contract.schema import ObservationLayout
from pipeline.reads.episodes import Episodes
from pipeline.rows.feed import row_feed
from pipeline.rows.options import RowStream
from pipeline.streams.collate import Batch, finalize
from pipeline.streams.epoch_feed import EpochFeed
from pipeline.streams.group import StreamGroup
from pipeline.streams.slot import Batches, Bundle, EpochEnd, LearnerSlot, Message
from pipeline.streams.stall import StreamStalledError
from pipeline.tasks.feed import TaskFeed, TaskWindowFeed
from pipeline.tasks.grouping import TaskSamples
from pipeline.tasks.options import TaskStream
from pipeline.tasks.windows import TaskWindows

if TYPE_CHECKING:
    import ray.data

__all__ = ["LearnerStream", "StreamStalledError", "split_for_learners"]


class LearnerStream:
    """One learner's endless, epoch-by-epoch stream of minibatches (or meta-batches).

    Build it with ``split_for_learners``. ``take(n)`` yields exactly ``n`` batches on
    ``device``; the next ``take`` continues where the last stopped, crossing into the
    next epoch (reshuffled with ``seed + epoch``) when one ends.
    """

    def __init__(self, slot: LearnerSlot, group: StreamGroup) -> None:
        self.name = slot.name
        self.rank = slot.rank
        self._slot = slot
        self._group = group
        self._pending: deque[Batch] = deque()
        self._messages: deque[Message] = deque()
        """The rest of the last bundle taken from the queue."""
        self._live_take: object | None = None
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
            "epoch": self._slot.epoch,
            "batches_consumed": self._slot.consumed,
            "exact": self._group.feed.exact,
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
        for key in _ABSENT_WHEN_OFF:
            if key in state and key not in expected:
                raise ValueError(
                    f"{self.name}: state was saved with {key}={state[key]!r} but this stream "
                    f"has none; build the streams with the saved settings"
                )
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
        self._slot.epoch, self._slot.consumed = epoch, consumed

    def stats(self) -> dict[str, Any]:
        """Counters for progress logs; ``rows_per_s`` counts from the first ``take``.

        ``dropped_rows`` counts the rows (transitions) that no learner of the split got
        in the epochs completed so far: the same number on every learner.
        """
        rows = self._batches * self._group.rows_per_batch
        elapsed = time.monotonic() - self._first_take if self._first_take else 0.0
        return {
            "learner": self.name,
            "epoch": self._slot.epoch,
            "batches": self._batches,
            "rows": rows,
            "epochs_completed": self._epochs_completed,
            "dropped_rows": self._dropped_rows,
            "wait_s": round(self._wait_s, 3),
            "rows_per_s": rows / elapsed if elapsed > 0 else 0.0,
            # Feeds with counters of their own (windows of task samples) add them.
            **self._group.feed.stats(),
        }

    def close(self) -> None:
        """Stop taking batches; the last learner of a split to close stops its producer
        thread. Idempotent."""
        if self._slot.closed:
            return
        self._group.release(self._slot)

    def __enter__(self) -> LearnerStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        slot = self._slot
        return f"LearnerStream({self.name!r}, epoch={slot.epoch}, batch={slot.consumed})"

    def _generate(self, num_iters: int, token: object) -> Iterator[Batch]:
        try:
            if self._first_take is None:
                self._first_take = time.monotonic()
            device, layout = self._group.device, self._group.obs_layout
            for _ in range(num_iters):
                batch = self._next_batch()
                if device.type == "cpu" and layout is None:
                    # Collate already made CPU tensors: nothing to move or convert.
                    yield batch
                else:
                    yield finalize(batch, device, obs_layout=layout)
        finally:
            self._release_take(token)

    def _release_take(self, token: object) -> None:
        if self._live_take is token:
            self._live_take = None

    def _next_batch(self) -> Batch:
        slot = self._slot
        while not self._pending:
            message = self._next_message()
            if type(message) is Batches:
                # After a restore, this learner may be ahead of the group's slowest one.
                skipped = min(slot.discard, len(message.batches))
                slot.discard -= skipped
                slot.drawn += skipped
                self._pending.extend(message.batches[skipped:])
            elif type(message) is EpochEnd:
                slot.epoch += 1
                slot.consumed = 0
                self._epochs_completed += 1
                self._dropped_rows += message.dropped_rows
            else:
                slot.failure = message.error
                raise message.error
        slot.consumed += 1
        slot.drawn += 1
        self._batches += 1
        self._group.board.active(self.name)
        return self._pending.popleft()

    def _next_message(self) -> Message:
        self._check_usable()
        if not self._messages:
            self._messages.extend(self._next_bundle())
        return self._messages.popleft()

    def _next_bundle(self) -> Bundle:
        board = self._group.board
        try:
            # Once another learner gave up on this split, this one stops too.
            board.check(self.name)
        except StreamStalledError as error:
            self._slot.failure = error
            raise
        with contextlib.suppress(queue.Empty):
            return self._slot.queue.get_nowait()
        started = time.monotonic()
        board.start_wait(self.name)
        try:
            while True:
                board.check(self.name)
                with contextlib.suppress(queue.Empty):
                    return self._slot.queue.get(timeout=self._poll_s)
        except StreamStalledError as error:
            self._slot.failure = error
            raise
        finally:
            board.end_wait(self.name)
            self._wait_s += time.monotonic() - started

    def _check_usable(self) -> None:
        if self._slot.closed:
            raise RuntimeError(f"{self.name}: the stream is closed")
        if self._slot.failure is not None:
            raise self._slot.failure


_ABSENT_WHEN_OFF = ("shift",)
"""Settings a stream's state holds only when they are on (states saved before they
existed resume as off)."""


def split_for_learners(
    data: Episodes | ray.data.DataIterator | RowStream | TaskSamples | TaskWindows | TaskStream,
    num_learners: int,
    *,
    minibatch_size: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    stall_timeout_s: float = 60.0,
) -> list[LearnerStream]:
    """Split ``data`` once into one repeatable stream per learner.

    ``data`` is ``Episodes`` (row minibatches of ``minibatch_size`` rows), the result of
    ``task_samples`` (meta-batches of ``minibatch_size`` tasks per learner, in memory or
    read window by window), or a Ray ``DataIterator`` that is already one learner's shard
    (Ray Train's ``get_dataset_shard``; ``num_learners=1``); a ``RowStream`` or a
    ``TaskStream`` around them carries the options of that kind of stream (see the
    module). Row streams fetch super-batches of rows, shuffle the file order (the block
    order when materialized) and the rows inside each super-batch with ``seed + epoch``,
    and deal minibatches to the learners in turn; they keep the first epoch read to its
    end in memory and serve later epochs from it, with the same batches a re-read gives,
    when it fits ``RowStream.cache_budget_mb``. ``stall_timeout_s`` bounds how long a
    learner waits for data that a stopped learner holds up before ``StreamStalledError``.
    """
    _check_int("num_learners", num_learners, 1)
    _check_int("minibatch_size", minibatch_size, 1)
    _check_int("seed", seed, 0)
    if stall_timeout_s <= 0:
        raise ValueError(f"stall_timeout_s must be > 0 seconds, got {stall_timeout_s}")
    device = torch.device(device)
    if isinstance(data, TaskSamples | TaskWindows):
        data = TaskStream(data)
    elif not isinstance(data, RowStream | TaskStream):
        data = RowStream(data)
    pin_memory = device.type == "cuda"
    if isinstance(data, TaskStream):
        plan = _task_plan(data, num_learners, minibatch_size, seed, pin_memory)
    else:
        feed = row_feed(
            data, num_learners, minibatch_size=minibatch_size, seed=seed, pin_memory=pin_memory
        )
        plan = _Plan(feed, list(range(num_learners)), "rows", minibatch_size, {})
    group = StreamGroup(
        feed=plan.feed,
        ranks=plan.ranks,
        settings={
            "kind": plan.kind,
            "num_learners": num_learners,
            "seed": seed,
            "minibatch_size": minibatch_size,
            **plan.settings,
        },
        rows_per_batch=plan.rows_per_batch,
        device=device,
        stall_timeout_s=stall_timeout_s,
        obs_layout=_obs_layout(data),
    )
    return [LearnerStream(slot, group) for slot in group.slots]


def _obs_layout(data: RowStream | TaskStream) -> ObservationLayout | None:
    """Layout of the data's uint8 image observations; ``None`` for float observations, and
    for a Ray ``DataIterator``, which finalize still converts as ``CHW`` images."""
    if isinstance(data, TaskStream):
        samples = data.samples
        return samples.schema.obs_layout if isinstance(samples, TaskWindows) else samples.obs_layout
    return data.data.schema.obs_layout if isinstance(data.data, Episodes) else None


class _Plan(NamedTuple):
    """A group's feed, and what ``state()`` and ``stats()`` say about it."""

    feed: EpochFeed
    ranks: list[int]
    kind: str
    rows_per_batch: int
    settings: dict[str, Any]
    """Settings a saved state must match besides the common ones."""


def _task_plan(
    stream: TaskStream, num_learners: int, minibatch_size: int, seed: int, pin_memory: bool
) -> _Plan:
    ranks = list(range(num_learners)) if stream.ranks is None else list(stream.ranks)
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= r < num_learners for r in ranks):
        raise ValueError(f"ranks must be distinct learners in [0, {num_learners}), got {ranks}")
    samples = stream.samples
    options: dict[str, Any] = {
        "tasks_per_batch": minibatch_size,
        "seed": seed,
        "ranks": ranks,
        "num_learners": num_learners,
        "pin_memory": pin_memory,
        "shift": stream.shift,
    }
    rows_per_batch = minibatch_size * (samples.support + samples.query)
    # Other offsets give other batches: a state resumes only the same shift.
    shifted = {} if stream.shift is None else {"shift": stream.shift.describe()}
    if isinstance(samples, TaskWindows):
        # Another window size gives other batches: a state resumes only the same one.
        settings = {"window_rows": samples.window_rows, **shifted}
        return _Plan(
            TaskWindowFeed(samples, **options), ranks, "task_windows", rows_per_batch, settings
        )
    return _Plan(TaskFeed(samples, **options), ranks, "tasks", rows_per_batch, shifted)


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
