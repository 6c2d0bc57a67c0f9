"""Meta-batch streams of task samples, with the option only they have: ``ranks``.

``split_for_learners(samples, ...)`` builds the streams of every learner. A Ray Train
worker builds only its own, from the same task samples, with
``split_for_learners(TaskStream(samples, ranks=[rank]), world, ...)``: a task stream's
meta-batches depend on the seed and the learner's rank alone, so workers need no shared
read. Row streams are dealt from one read and always built together (their options are
``pipeline.rows.options.RowStream``'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.tasks.grouping import TaskSamples
from pipeline.tasks.obs_shift import ObsShift
from pipeline.tasks.windows import TaskWindows


@dataclass(frozen=True)
class TaskStream:
    """Meta-batches of ``samples`` (``task_samples``' result) for the learners ``ranks``."""

    samples: TaskSamples | TaskWindows
    ranks: Sequence[int] | None = None
    """The learners whose streams to build (default: all of them)."""
    shift: ObsShift | None = None
    """A random offset per task sample added to observation features (task augmentation,
    ``pipeline.tasks.obs_shift``); None: the observations as recorded."""

    def __post_init__(self) -> None:
        if not isinstance(self.samples, TaskSamples | TaskWindows):
            raise TypeError(
                "TaskStream streams the result of task_samples (TaskSamples or TaskWindows), "
                f"got {type(self.samples).__name__}; pass Episodes to split_for_learners as "
                "they are (or in a RowStream)"
            )
