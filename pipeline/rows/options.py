"""What a row stream delivers and how it reads: the options only row streams have.

``split_for_learners`` takes the options common to every stream (learners, minibatch size,
seed, device, stall timeout); what belongs to row streams alone travels with the rows in a
``RowStream``, so an option no other kind of stream has cannot be passed to one:

    split_for_learners(RowStream(episodes, columns=["obs"], gamma=0.99), 2, minibatch_size=64)

``split_for_learners(episodes, ...)`` streams ``RowStream(episodes)``: the defaults below.
Task samples choose their columns, modules and discount in ``task_samples`` instead, and
take their one option of their own in ``pipeline.tasks.options.TaskStream``.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.reads.episodes import Episodes

if TYPE_CHECKING:
    import ray.data


@dataclass(frozen=True)
class RowStream:
    """Row minibatches of ``data`` (``Episodes``, or a Ray ``DataIterator`` that is already
    one learner's shard, as Ray Train's ``get_dataset_shard`` gives it)."""

    data: Episodes | ray.data.DataIterator
    columns: Sequence[str] | None = None
    """Columns of every minibatch; default: the training columns the data has."""
    modules_to_update: Collection[str] | None = None
    """Modules whose rows are delivered; default: every module."""
    gamma: float | None = None
    """Discount of the columns derived at ingest (``returns``, ``returns_truncated``; see
    ``pipeline.reads.returns``); needed to name them in ``columns``."""
    superbatch_rows: int = 16384
    """Rows per super-batch read and shuffled at once (rounded down to whole minibatches)."""
    materialize: bool = False
    """Read the selected columns once, when the streams are built, into Ray's object store
    (which spills to disk when full); later epochs reshuffle its blocks."""
    cache_budget_mb: float | None = None
    """Keep the first epoch in memory for later epochs when the selected columns take at
    most this many MiB (default: a quarter of Ray's object store; 0: read every epoch from
    the files, two windows of files in memory at most)."""

    def __post_init__(self) -> None:
        if not isinstance(self.data, Episodes):
            import ray.data

            if not isinstance(self.data, ray.data.DataIterator):
                raise TypeError(
                    "RowStream streams the rows of Episodes (read_episodes) or of a Ray "
                    f"DataIterator (one learner's shard), got {type(self.data).__name__}; "
                    "pass task samples to split_for_learners as they are (or in a TaskStream)"
                )
        superbatch = self.superbatch_rows
        if isinstance(superbatch, bool) or not isinstance(superbatch, int) or superbatch < 1:
            raise ValueError(f"superbatch_rows must be an int >= 1, got {superbatch!r}")
        if self.cache_budget_mb is not None and not self.cache_budget_mb >= 0:
            raise ValueError(
                f"cache_budget_mb must be >= 0 MiB (0 reads every epoch from the files) or "
                f"None (a quarter of Ray's object store), got {self.cache_budget_mb!r}"
            )
