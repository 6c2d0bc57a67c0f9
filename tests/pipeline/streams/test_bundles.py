"""The producer hands its messages over in bundles (``pipeline.streams.group``): small epochs
are gathered until they hold ``BUNDLE_ROWS`` rows, so the producer wakes once for many steps;
what the learner takes is unchanged, epochs and positions included; and nothing is held back
from a learner whose queue is empty.

A feed of our own (the ``EpochFeed`` protocol): epoch e deals ``DEALS`` batches of one row
each, every batch the tensor ``[e, j]``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from pipeline.streams import group as group_module
from pipeline.streams.epoch_feed import Deal
from pipeline.streams.group import StreamGroup
from pipeline.streams.learner_stream import LearnerStream
from pipeline.streams.slot import Batches, Bundle

DEALS = 2


class CountingFeed:
    """Epoch e deals ``[e, 0]``, ``[e, 1]``, ...; ``hold`` (when given) stops the feed after
    its first deal until it is set."""

    exact = True

    def __init__(self, hold: threading.Event | None = None) -> None:
        self.hold = hold

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        for j in range(skip, DEALS):
            if self.hold is not None and (epoch, j) != (0, 0):
                self.hold.wait()
            yield Deal([[torch.tensor([epoch, j])]], rows=1, dropped_rows=0)
        yield Deal([[]], rows=0, dropped_rows=3)

    def describe_empty(self, epoch: int, rows: int) -> str:
        return f"epoch {epoch} is empty"

    def stats(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        pass


def _stream(feed: CountingFeed) -> LearnerStream:
    group = StreamGroup(
        feed=feed,
        ranks=[0],
        settings={},
        rows_per_batch=1,
        device=torch.device("cpu"),
        stall_timeout_s=30.0,
    )
    (slot,) = group.slots
    return LearnerStream(slot, group)


@pytest.mark.timeout(30)
def test_small_epochs_are_handed_over_together_and_taken_as_dealt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(group_module, "BUNDLE_ROWS", 6)  # 3 epochs of 2 one-row batches
    stream = _stream(CountingFeed())
    handed: list[int] = []
    queue = stream._slot.queue
    real_put = queue.put

    def counting_put(bundle: Bundle, *args: Any, **kwargs: Any) -> None:
        handed.append(sum(len(m.batches) for m in bundle if isinstance(m, Batches)))
        real_put(bundle, *args, **kwargs)

    monkeypatch.setattr(queue, "put", counting_put)
    with stream:
        taken = []
        for batch in stream.take(20):
            taken.append(batch.tolist())
            time.sleep(0.005)  # a learner's step: the producer gets ahead
        state = stream.state()
        stats = stream.stats()
    assert taken == [[e, j] for e in range(10) for j in range(DEALS)]
    # The last epoch's end is read with the batch after it, as without bundles.
    assert (state["epoch"], state["batches_consumed"]) == (9, DEALS)
    assert (stats["epochs_completed"], stats["dropped_rows"]) == (9, 27)
    # Once the learner had batches queued, the producer handed over 3 epochs at a time.
    assert max(handed) == 6 and handed.count(6) >= 4, handed


@pytest.mark.timeout(30)
def test_a_learner_with_an_empty_queue_gets_what_is_gathered_at_once() -> None:
    hold = threading.Event()
    stream = _stream(CountingFeed(hold))
    try:
        # The feed stops after its first batch (rows far below BUNDLE_ROWS): the learner,
        # whose queue is empty, still gets it.
        (first,) = list(stream.take(1))
        assert first.tolist() == [0, 0]
    finally:
        hold.set()
        stream.close()
