"""The learners of one ``split_for_learners`` call: one feed of batches, one producer
thread that deals every learner the same number of batches through a small bounded queue
of its own, one progress board that names a learner that stopped taking them. Each
learner's queue and position are its ``LearnerSlot`` (``pipeline.streams.slot``), which
the group owns; ``pipeline.streams.learner_stream.LearnerStream`` is each learner's end.

The producer hands its messages over in *bundles*: it gathers deals and epoch ends until
they hold ``BUNDLE_ROWS`` rows of batches, or until a learner has no batch left to take
(it may be waiting: nothing is held back from it). A feed whose epochs are a batch or
two (a handful of tasks) then wakes the producer once for many steps instead of once a
step: the producer runs Python under the GIL, and a learner's step that has to win the GIL
back after every operation it released it for loses far more to a producer that runs a
little every step than to one that runs the same work in bursts (docs/performance.md)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.contract.schema import DatasetError, ObservationLayout
from pipeline.streams.collate import Batch
from pipeline.streams.epoch_feed import EpochFeed
from pipeline.streams.slot import (
    BUNDLE_ROWS,
    Batches,
    Bundle,
    EpochEnd,
    Failed,
    LearnerSlot,
    Message,
)
from pipeline.streams.stall import ProgressBoard

CLOSE_JOIN_S = 10.0


class StreamGroup:
    """The learners of one ``split_for_learners`` call: one feed, one producer thread,
    one progress board, a slot (queue and position) per learner."""

    def __init__(
        self,
        *,
        feed: EpochFeed,
        ranks: Sequence[int],
        settings: dict[str, Any],
        rows_per_batch: int,
        device: torch.device,
        stall_timeout_s: float,
        obs_layout: ObservationLayout | None = None,
    ) -> None:
        self.feed = feed
        self.settings = settings
        self.rows_per_batch = rows_per_batch
        self.device = device
        self.obs_layout = obs_layout
        """Layout of uint8 image observations, for finalize; ``None`` without images."""
        self.board = ProgressBoard([f"learner-{r}" for r in ranks], stall_timeout_s)
        self.slots = [LearnerSlot(name=f"learner-{r}", rank=r) for r in ranks]
        self.started = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gathered: list[list[Message]] = [[] for _ in self.slots]
        """Each learner's messages not yet handed over (the producer's alone)."""
        self._gathered_rows = 0

    def start(self) -> None:
        with self._lock:
            if self.started:
                return
            self.started = True
            epochs = {slot.epoch for slot in self.slots}
            if len(epochs) > 1:
                saved = ", ".join(f"{slot.name}: {slot.epoch}" for slot in self.slots)
                error = ValueError(
                    f"learners of one split were restored to different epochs ({saved}); "
                    "restore states saved at the same step"
                )
                for slot in self.slots:
                    slot.failure = error
                raise error
            skip = min(slot.consumed for slot in self.slots)
            for slot in self.slots:
                slot.discard = slot.consumed - skip
            names = "+".join(slot.name for slot in self.slots)
            self._thread = threading.Thread(
                target=self._produce,
                args=(epochs.pop(), skip),
                name=f"offmeta-stream-{names}",
                daemon=True,
            )
            self._thread.start()

    def release(self, slot: LearnerSlot) -> None:
        """``slot``'s learner closed its stream; the last to close stops the producer."""
        slot.closed = True
        self.board.closed(slot.name)
        _drain(slot.queue)
        if all(other.closed for other in self.slots):
            self._stop.set()
            for other in self.slots:
                _drain(other.queue)
            if self._thread is not None:
                self._thread.join(timeout=CLOSE_JOIN_S)

    def _produce(self, epoch: int, skip: int) -> None:
        names = ", ".join(slot.name for slot in self.slots)
        try:
            while not self._stop.is_set():
                rows = dropped = rounds = 0
                with contextlib.closing(self.feed.deals(epoch, skip)) as deals:
                    for deal in deals:
                        rows += deal.rows
                        dropped += deal.dropped_rows
                        rounds += len(deal.batches[0])
                        if deal.batches[0] and not self._deal(deal.batches, deal.rows):
                            return
                        if self._stop.is_set():
                            return
                if rounds + skip == 0:
                    raise DatasetError(f"{names}: {self.feed.describe_empty(epoch, rows)}")
                if not self._broadcast(EpochEnd(dropped)):
                    return
                epoch, skip = epoch + 1, 0
        except BaseException as error:  # relayed to every learner, which re-raises it
            self._broadcast(Failed(error), now=True)
        finally:
            # Row feeds read the next epoch ahead: stop those reads with this thread.
            self.feed.close()

    def _deal(self, batches: list[list[Batch]], rows: int) -> bool:
        for gathered, mine in zip(self._gathered, batches, strict=True):
            gathered.append(Batches(mine))
        self._gathered_rows += rows
        return self._hand_over_when_due()

    def _broadcast(self, message: Message, *, now: bool = False) -> bool:
        for gathered in self._gathered:
            gathered.append(message)
        return self._hand_over() if now else self._hand_over_when_due()

    def _hand_over_when_due(self) -> bool:
        """Hands the gathered messages over once they hold ``BUNDLE_ROWS`` rows, or as soon
        as a learner has no batch left to take; False when the group stopped."""
        starving = any(s.dealt <= s.drawn for s in self.slots if not s.closed)
        return self._hand_over() if starving or self._gathered_rows >= BUNDLE_ROWS else True

    def _hand_over(self) -> bool:
        """Every learner's gathered messages as one bundle each (none when nothing is
        gathered); False when the group stopped."""
        bundles = [tuple(gathered) for gathered in self._gathered]
        self._gathered = [[] for _ in self.slots]
        self._gathered_rows = 0
        return all(
            self._put(slot, bundle)
            for slot, bundle in zip(self.slots, bundles, strict=True)
            if bundle
        )

    def _put(self, slot: LearnerSlot, bundle: Bundle) -> bool:
        # Blocks while the learner's queue is full: a learner that stops taking stops
        # the whole split, and the others' stall check names it.
        batches = sum(len(m.batches) for m in bundle if type(m) is Batches)
        while not self._stop.is_set():
            if slot.closed:
                return True
            with contextlib.suppress(queue.Full):
                slot.queue.put(bundle, timeout=0.1)
                slot.dealt += batches
                return True
        return False


def _drain(items: queue.Queue[Bundle]) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            items.get_nowait()
