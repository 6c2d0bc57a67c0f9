"""One learner's place in a group: its queue, its position, and the messages the group's
producer sends it.

The group (``pipeline.streams.group``) owns a ``LearnerSlot`` per learner and hands each
``LearnerStream`` its own; the two are the only ones to touch it. The stream moves the
position as it hands out batches (and sets it on ``restore``); the group reads the
positions when it starts, and sets how many batches each learner discards (a learner
restored ahead of the slowest one) and the failure of a start that cannot be resumed.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import Any, NamedTuple

PREFETCH_BUNDLES = 2
"""Bundles a learner's queue holds before the producer waits for it."""

BUNDLE_ROWS = 8192
"""Rows of batches the producer gathers into one bundle while the learner has others to
take (``pipeline.streams.group``): half the task feed's deal (16,384 rows), so a feed whose
deals are that large hands each over alone, as it did before bundles, and what is in flight
stays within two bundles and the one being gathered."""


class Batches(NamedTuple):
    """A deal's batches for one learner, in order."""

    batches: list[Any]


class EpochEnd(NamedTuple):
    """The epoch ended: the next batch is the first of the next epoch."""

    dropped_rows: int
    """Rows of the epoch that no learner of the group got."""


class Failed(NamedTuple):
    """The producer failed: every learner re-raises ``error``."""

    error: BaseException


Message = Batches | EpochEnd | Failed

Bundle = tuple[Message, ...]
"""Messages handed over together, in order: what a learner's queue holds."""


@dataclass(eq=False)
class LearnerSlot:
    """The state one learner's stream and its group share (see the module)."""

    name: str
    rank: int
    queue: queue.Queue[Bundle] = field(
        default_factory=lambda: queue.Queue(maxsize=PREFETCH_BUNDLES), repr=False
    )
    epoch: int = 0
    """The epoch the next batch handed out belongs to."""
    consumed: int = 0
    """Batches handed out in ``epoch``."""
    discard: int = 0
    """Batches still to drop before the next one handed out (set when the group starts)."""
    dealt: int = 0
    """Batches the producer has put in the queue, ever (the producer alone writes it)."""
    drawn: int = 0
    """Batches the stream has taken out of those, handed out or discarded, ever (the
    stream alone writes it): ``dealt - drawn`` are still there for the learner."""
    closed: bool = False
    failure: BaseException | None = None
    """The error every later call of the stream raises again."""
