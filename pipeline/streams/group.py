"""The learners of one ``split_for_learners`` call: one source of batches, one producer
thread that deals every learner the same number of batches through a small bounded queue
of its own, one progress board that names a learner that stopped taking them (see
``pipeline.streams.learner_stream``, whose ``LearnerStream`` is each learner's end)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from pipeline.contract.schema import DatasetError
from pipeline.rows.feed import EpochSource
from pipeline.streams.collate import Batch
from pipeline.streams.stall import ProgressBoard

if TYPE_CHECKING:
    from pipeline.streams.learner_stream import LearnerStream

CLOSE_JOIN_S = 10.0


class StreamGroup:
    """The learners of one ``split_for_learners`` call: one source, one producer thread,
    one progress board, a queue per learner."""

    def __init__(
        self,
        *,
        source: EpochSource,
        ranks: Sequence[int],
        settings: dict[str, Any],
        rows_per_batch: int,
        device: torch.device,
        stall_timeout_s: float,
        make_stream: Callable[..., LearnerStream],
    ) -> None:
        self.source = source
        self.settings = settings
        self.rows_per_batch = rows_per_batch
        self.device = device
        self.board = ProgressBoard([f"learner-{r}" for r in ranks], stall_timeout_s)
        self.streams = [make_stream(name=f"learner-{r}", rank=r, group=self) for r in ranks]
        self.started = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self.started:
                return
            self.started = True
            epochs = {s._epoch for s in self.streams}
            if len(epochs) > 1:
                saved = ", ".join(f"{s.name}: {s._epoch}" for s in self.streams)
                error = ValueError(
                    f"learners of one split were restored to different epochs ({saved}); "
                    "restore states saved at the same step"
                )
                for stream in self.streams:
                    stream._failure = error
                raise error
            skip = min(s._consumed for s in self.streams)
            for stream in self.streams:
                stream._discard = stream._consumed - skip
            names = "+".join(s.name for s in self.streams)
            self._thread = threading.Thread(
                target=self._produce,
                args=(epochs.pop(), skip),
                name=f"offmeta-stream-{names}",
                daemon=True,
            )
            self._thread.start()

    def release(self, stream: LearnerStream) -> None:
        self.board.closed(stream.name)
        _drain(stream._queue)
        if all(s._closed for s in self.streams):
            self._stop.set()
            for other in self.streams:
                _drain(other._queue)
            if self._thread is not None:
                self._thread.join(timeout=CLOSE_JOIN_S)

    def _produce(self, epoch: int, skip: int) -> None:
        names = ", ".join(s.name for s in self.streams)
        try:
            while not self._stop.is_set():
                rows = dropped = rounds = 0
                with contextlib.closing(self.source.deals(epoch, skip)) as deals:
                    for deal in deals:
                        rows += deal.rows
                        dropped += deal.dropped_rows
                        rounds += len(deal.batches[0])
                        if deal.batches[0] and not self._deal(deal.batches):
                            return
                        if self._stop.is_set():
                            return
                if rounds + skip == 0:
                    raise DatasetError(f"{names}: {self.source.describe_empty(epoch, rows)}")
                if not self._broadcast(("end", dropped)):
                    return
                epoch, skip = epoch + 1, 0
        except BaseException as error:  # relayed to every learner, which re-raises it
            self._broadcast(("error", error))
        finally:
            # Row sources read the next epoch ahead: stop those reads with this thread.
            close = getattr(self.source, "close", None)
            if close is not None:
                close()

    def _deal(self, batches: list[list[Batch]]) -> bool:
        return all(
            self._put(stream, ("batches", mine))
            for stream, mine in zip(self.streams, batches, strict=True)
        )

    def _broadcast(self, item: tuple[Any, ...]) -> bool:
        return all(self._put(stream, item) for stream in self.streams)

    def _put(self, stream: LearnerStream, item: tuple[Any, ...]) -> bool:
        # Blocks while the learner's queue is full: a learner that stops taking stops
        # the whole split, and the others' stall check names it.
        while not self._stop.is_set():
            if stream._closed:
                return True
            with contextlib.suppress(queue.Full):
                stream._queue.put(item, timeout=0.1)
                return True
        return False


def _drain(items: queue.Queue) -> None:
    with contextlib.suppress(queue.Empty):
        while True:
            items.get_nowait()
