"""The learners of one ``split_for_learners`` call: one feed of batches, one producer
thread that deals every learner the same number of batches through a small bounded queue
of its own, one progress board that names a learner that stopped taking them. Each
learner's queue and position are its ``LearnerSlot`` (``pipeline.streams.slot``), which
the group owns; ``pipeline.streams.learner_stream.LearnerStream`` is each learner's end."""

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
from pipeline.streams.slot import Batches, EpochEnd, Failed, LearnerSlot, Message
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
                        if deal.batches[0] and not self._deal(deal.batches):
                            return
                        if self._stop.is_set():
                            return
                if rounds + skip == 0:
                    raise DatasetError(f"{names}: {self.feed.describe_empty(epoch, rows)}")
                if not self._broadcast(EpochEnd(dropped)):
                    return
                epoch, skip = epoch + 1, 0
        except BaseException as error:  # relayed to every learner, which re-raises it
            self._broadcast(Failed(error))
        finally:
            # Row feeds read the next epoch ahead: stop those reads with this thread.
            self.feed.close()

    def _deal(self, batches: list[list[Batch]]) -> bool:
        return all(
            self._put(slot, Batches(mine)) for slot, mine in zip(self.slots, batches, strict=True)
        )

    def _broadcast(self, message: Message) -> bool:
        return all(self._put(slot, message) for slot in self.slots)

    def _put(self, slot: LearnerSlot, message: Message) -> bool:
        # Blocks while the learner's queue is full: a learner that stops taking stops
        # the whole split, and the others' stall check names it.
        while not self._stop.is_set():
            if slot.closed:
                return True
            with contextlib.suppress(queue.Full):
                slot.queue.put(message, timeout=0.1)
                return True
        return False


def _drain(items: queue.Queue[Message]) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            items.get_nowait()
