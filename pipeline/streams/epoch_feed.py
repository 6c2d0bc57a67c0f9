"""What feeds the learners of a group, one epoch at a time: the ``EpochFeed`` protocol.

A *feed* turns ``(epoch, rounds to skip)`` into *deals*: each deal hands every learner of
the group the same number of collated batches. One producer thread runs the feed for the
whole group (``pipeline.streams.group``); a feed knows nothing about threads. Row feeds
(``pipeline.rows.feed``) cut minibatches from Arrow super-batches, task feeds
(``pipeline.tasks.feed``) cut meta-batches from task samples.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Deal:
    """Batches for each learner of the group (equal counts), and the rows behind them."""

    batches: list[list[Any]]
    rows: int
    """Rows (transitions) read for this deal."""
    dropped_rows: int
    """Rows read that no learner gets."""


class EpochFeed(Protocol):
    exact: bool
    """True when an epoch's batches depend only on (seed, epoch): resume is exact."""

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        """The epoch's batches after the first ``skip`` rounds (one batch per learner)."""
        ...

    def describe_empty(self, epoch: int, rows: int) -> str:
        """Why epoch ``epoch`` gave no round of batches, after reading ``rows`` rows."""
        ...

    def stats(self) -> dict[str, int]:
        """Counters of the feed's own for progress logs (none: ``{}``)."""
        ...

    def close(self) -> None:
        """Stop whatever the feed reads ahead; the producer calls it when it ends."""
        ...
