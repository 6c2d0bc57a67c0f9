"""Task samples in memory: rows grouped by (module, task), and ``TaskSamples`` built
from them.

A ``TaskSamples`` holds the selected columns sorted by (module, task, episode, step), so
that nothing depends on file order, and where each (module, task) group starts. Every
epoch is planned in a few vectorised numpy calls from ``seed + epoch`` alone
(``TaskSamples.epoch_plan``):

1. permute each task's rows, cut them into ``n // (K + Q)`` disjoint chunks, split each
   chunk into K support + Q query transitions (a transition is used at most once per
   epoch, support and query never overlap);
2. shuffle the samples of all tasks together;
3. meta-batch ``j`` of learner ``r`` out of ``W`` takes samples
   ``[(j * W + r) * M, (j * W + r + 1) * M)`` (``pipeline.tasks.feed``).

Step 3 makes the learners' shares of step ``j`` together exactly the ``M * W`` samples a
single learner with meta-batches of ``M * W`` tasks gets at step ``j``: two workers with
M/2 tasks each compute the same averaged meta-gradient as one worker with M tasks.

The grouping helpers are shared by the in-memory read (``pipeline.tasks.samples``) and
the windows of tasks (``pipeline.tasks.windows``), which builds a ``TaskSamples`` per
window.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.schema import (
    DEFAULT_MODULE_ID,
    DEFAULT_TASK_ID,
    DatasetError,
    EpisodeSchema,
    ObservationLayout,
)
from pipeline.io.arrow_columns import decoded
from pipeline.reads.returns import INPUT_COLUMNS, returns_columns
from pipeline.streams.columns import column_array
from pipeline.tasks.episodes import (
    EpisodeRows,
    EpisodeSupport,
    episode_rows,
    episode_steps,
    group_samples,
    plan_episode_samples,
)

if TYPE_CHECKING:
    from pipeline.streams.collate import Batch

_LISTED = 20


@dataclass(frozen=True, eq=False)
class TaskSamples:
    """The selected columns of a dataset in memory, grouped by (module, task).

    Build with ``task_samples``; hand to ``split_for_learners`` for meta-batch streams.
    """

    support: int
    query: int
    columns: tuple[str, ...]
    task_ids: tuple[str, ...]
    """Sorted ids of the tasks that are sampled."""
    module_ids: tuple[str, ...]
    skipped_tasks: dict[str, int]
    """Tasks left out for having fewer than ``support + query`` transitions -> their size."""
    fingerprint: str | None
    arrays: dict[str, np.ndarray] = field(repr=False)
    """Column -> ``[rows, *shape]``, rows sorted by (module, task, eps_id, t)."""
    group_offsets: np.ndarray = field(repr=False)
    """Row offsets of the (module, task) groups, ``[groups + 1]``."""
    group_modules: np.ndarray = field(repr=False)
    """Index into ``module_ids`` for each group."""
    group_samples: np.ndarray = field(repr=False)
    """Disjoint samples each group gives per epoch (0 for skipped tasks)."""
    obs_layout: ObservationLayout | None = None
    """Axis order of uint8 image observations (``EpisodeSchema.obs_layout``), which
    finalize turns into float ``[C, H, W]``; ``None`` for float observations."""
    episodes: EpisodeSupport | None = None
    """Support sets of episodes (``pipeline.tasks.episodes``); None: of K transitions."""
    episode_rows: EpisodeRows | None = field(default=None, repr=False)
    """Where each episode's rows are (with ``episodes``)."""

    @property
    def samples_per_epoch(self) -> int:
        return int(self.group_samples.sum())

    @property
    def rows_per_sample(self) -> int:
        """Rows a sample takes for itself in an epoch: K + Q, or, with episode support
        sets, K (query rows are drawn from the other episodes, which other samples use)."""
        return self.support if self.episodes is not None else self.support + self.query

    def summary(self) -> dict[str, Any]:
        """Plain-JSON description for logs (with episode support sets, unused rows are
        those in no support set)."""
        counts = np.diff(self.group_offsets)
        return {
            "mode": "memory",
            "support": self.support,
            "query": self.query,
            "tasks": len(self.task_ids),
            "modules": list(self.module_ids),
            "rows": int(self.group_offsets[-1]),
            "samples_per_epoch": self.samples_per_epoch,
            "unused_rows_per_epoch": int(
                (counts - self.group_samples * self.rows_per_sample).sum()
            ),
            "skipped_tasks": len(self.skipped_tasks),
            **(self.episodes.describe() if self.episodes is not None else {}),
        }

    def epoch_plan(self, seed: int | np.random.SeedSequence) -> tuple[np.ndarray, np.ndarray]:
        """Row indices ``[samples, K + Q]`` and module index ``[samples]`` of one epoch."""
        rng = np.random.default_rng(seed)
        if self.episodes is not None:
            rows, sample_group = self._episode_plan(rng)
            order = rng.permutation(len(rows))
            return rows[order], self.group_modules[sample_group[order]]
        size = self.support + self.query
        counts = np.diff(self.group_offsets)
        row_group = np.repeat(np.arange(len(counts)), counts)
        # Rows stay grouped by task (they are stored that way), in random order inside.
        shuffled = np.lexsort((rng.random(len(row_group)), row_group))
        sample_group = np.repeat(np.arange(len(counts)), self.group_samples)
        first_sample = np.cumsum(self.group_samples) - self.group_samples
        within = np.arange(len(sample_group)) - first_sample[sample_group]
        starts = self.group_offsets[sample_group] + within * size
        rows = shuffled[starts[:, None] + np.arange(size)]
        order = rng.permutation(len(rows))
        return rows[order], self.group_modules[sample_group[order]]

    def one_per_task(self, num_tasks: int, *, seed: int) -> tuple[dict[str, Batch], list[str]]:
        """A meta-batch of one K + Q sample from each of ``num_tasks`` tasks drawn with
        ``seed`` (all tasks if fewer), tasks in ``task_ids`` order, and their ids.

        Single-module samples only: there a task is one row group, stored in ``task_ids``
        order; with several modules a task id may name several groups.
        """
        if len(self.module_ids) != 1:
            raise ValueError(
                f"one_per_task needs task samples of one module, these have modules "
                f"{list(self.module_ids)}"
            )
        groups = np.flatnonzero(self.group_samples > 0)
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(len(groups), size=min(num_tasks, len(groups)), replace=False))
        if self.episodes is not None:
            # The first sample of each chosen task in an epoch planned from the same seed.
            planned, _ = self._episode_plan(rng)
            first = np.cumsum(self.group_samples) - self.group_samples
            rows = planned[first[groups[chosen]]]
        else:
            size = self.support + self.query
            rows = np.stack(
                [
                    rng.choice(
                        np.arange(self.group_offsets[g], self.group_offsets[g + 1]), size, False
                    )
                    for g in groups[chosen]
                ]
            )
        # Tensors only from here: planning and checking task samples import no torch.
        from pipeline.streams.collate import gather

        (module,) = self.module_ids
        meta_batch: dict[str, Batch] = {
            part: {module: {name: gather(array, index) for name, array in self.arrays.items()}}
            for part, index in (
                ("support", rows[:, : self.support]),
                ("query", rows[:, self.support :]),
            )
        }
        return meta_batch, [self.task_ids[i] for i in chosen]

    def _episode_plan(self, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        assert self.episodes is not None and self.episode_rows is not None
        steps = self.support // self.episodes.episodes
        return plan_episode_samples(
            rng,
            self.episodes,
            steps,
            self.query,
            self.episode_rows,
            self.group_offsets,
            self.group_samples,
        )


class RowGroups(NamedTuple):
    """Where the (module, task) groups of a table sorted by ``sort_by_task`` start."""

    offsets: np.ndarray
    """Row offsets of the groups, ``[groups + 1]``."""
    tasks: list[str]
    modules: list[str]


def of_modules(table: pa.Table, schema: EpisodeSchema, modules: Collection[str] | None) -> pa.Table:
    """The rows of ``table`` (read from files of ``schema``) that belong to ``modules``
    (None: all of them)."""
    if modules is None or not schema.has_module_id:
        return table
    wanted = pa.array(sorted(modules))
    return table.filter(pc.is_in(decoded(table.column("module_id")), wanted))


def sort_by_task(table: pa.Table) -> pa.Table:
    """``table`` sorted by (module, task, eps_id, t): an order that no file order changes."""
    ids = [name for name in ("module_id", "task_id") if name in table.column_names]
    keys = {name: decoded(table.column(name)) for name in [*ids, "eps_id", "t"]}
    if _in_order(list(keys.values())):
        return table  # sorted on disk already (import and compact write it so): no copy
    order = pc.sort_indices(pa.table(keys), sort_keys=[(name, "ascending") for name in keys])
    return table.take(order)


def group_rows(table: pa.Table) -> RowGroups:
    """The (module, task) groups of a non-empty table sorted by ``sort_by_task``."""
    modules = _strings(table, "module_id", DEFAULT_MODULE_ID)
    tasks = _strings(table, "task_id", DEFAULT_TASK_ID)
    changes = pc.or_(
        pc.not_equal(modules.slice(1), modules.slice(0, len(modules) - 1)),
        pc.not_equal(tasks.slice(1), tasks.slice(0, len(tasks) - 1)),
    )
    starts = np.concatenate(([0], np.flatnonzero(changes.to_numpy(zero_copy_only=False)) + 1))
    return RowGroups(
        offsets=np.concatenate((starts, [table.num_rows])),
        tasks=tasks.take(pa.array(starts)).to_pylist(),
        modules=modules.take(pa.array(starts)).to_pylist(),
    )


def grouped_samples(
    table: pa.Table,
    groups: RowGroups,
    *,
    support: int,
    query: int,
    stored: tuple[str, ...],
    derived: tuple[str, ...],
    gamma: float | None,
    module_ids: tuple[str, ...],
    skipped_tasks: dict[str, int],
    fingerprint: str | None,
    obs_layout: ObservationLayout | None = None,
    episodes: EpisodeSupport | None = None,
    steps: int | None = None,
) -> TaskSamples:
    """``TaskSamples`` of a table sorted by ``sort_by_task`` whose groups are ``groups``:
    its ``stored`` columns, then the ``derived`` ones computed with ``gamma``. With
    ``episodes``, support sets of episodes: ``support`` is ignored for K = E * ``steps``
    (each support episode's steps; None: from the episodes, ``episode_steps``)."""
    counts = np.diff(groups.offsets)
    rows_of_episodes = None
    if episodes is not None:
        rows_of_episodes = episode_rows(table.column("eps_id"), groups.offsets)
        if steps is None:
            steps = episode_steps(episodes, rows_of_episodes.lengths, "task_samples")
        support = episodes.episodes * steps
        samples, _ = group_samples(episodes, rows_of_episodes, counts, query)
    else:
        samples = counts // (support + query)
    small = samples == 0
    arrays = {name: column_array(table, name) for name in stored}
    if derived:
        assert gamma is not None  # split_derived refuses derived columns without it
        # Rows are in (module, task, episode, t) order: every episode is contiguous.
        computed = returns_columns(table, gamma)
        arrays.update({name: computed[name] for name in derived})
    return TaskSamples(
        support=support,
        query=query,
        columns=(*stored, *derived),
        task_ids=tuple(sorted({t for t, s in zip(groups.tasks, small, strict=True) if not s})),
        module_ids=module_ids,
        skipped_tasks=skipped_tasks,
        fingerprint=fingerprint,
        arrays=arrays,
        group_offsets=groups.offsets,
        group_modules=np.array([module_ids.index(m) for m in groups.modules], dtype=np.int64),
        group_samples=samples,
        obs_layout=obs_layout,
        episodes=episodes,
        episode_rows=rows_of_episodes,
    )


def check_task_sizes(
    tasks: Sequence[str],
    modules: Sequence[str],
    counts: np.ndarray,
    support: int,
    query: int,
    skip_small_tasks: bool,
) -> dict[str, int]:
    """The (module, task) groups smaller than K + Q -> their size, in group order;
    refused unless ``skip_small_tasks``, and always refused when every group is small."""
    size = support + query
    single_module = len(set(modules)) == 1
    small = counts < size
    skipped = {
        (task if single_module else f"{task} (module {module})"): int(count)
        for task, module, count, is_small in zip(tasks, modules, counts, small, strict=True)
        if is_small
    }
    if skipped and not skip_small_tasks:
        raise DatasetError(_small_tasks_message(skipped, support, query, len(tasks)))
    if small.all():
        raise DatasetError(
            f"task_samples: every one of the {len(tasks)} tasks has fewer than support + "
            f"query = {size} transitions (largest: {int(counts.max())}); lower support or query"
        )
    return skipped


def no_rows_message(modules: Collection[str] | None) -> str:
    return f"task_samples: no rows of modules {sorted(modules or [])} in the data"


def with_inputs(columns: tuple[str, ...], derived: tuple[str, ...]) -> tuple[str, ...]:
    """``columns`` and, when columns are derived, the stored ones they are derived from."""
    return tuple(dict.fromkeys((*columns, *INPUT_COLUMNS))) if derived else columns


def read_names(schema: EpisodeSchema, columns: tuple[str, ...]) -> list[str]:
    """``columns`` and those that order and group the rows by task."""
    ids = [name for name in ("module_id", "task_id") if getattr(schema, f"has_{name}")]
    return list(dict.fromkeys([*columns, *ids, "eps_id", "t"]))


def _in_order(keys: list[pa.ChunkedArray]) -> bool:
    """Whether the rows are already sorted by ``keys`` (lexicographically, ascending)."""
    if len(keys[0]) < 2:
        return True
    ordered = None
    for key in reversed(keys):
        later, earlier = key.slice(1), key.slice(0, len(key) - 1)
        if ordered is None:
            ordered = pc.greater_equal(later, earlier)
        else:
            ordered = pc.or_(pc.greater(later, earlier), pc.and_(pc.equal(later, earlier), ordered))
    return pc.all(ordered).as_py()


def _strings(table: pa.Table, name: str, default: str) -> pa.Array:
    if name not in table.column_names:
        return pa.array([default] * table.num_rows, pa.string())
    return decoded(table.column(name)).combine_chunks()


def _small_tasks_message(skipped: dict[str, int], support: int, query: int, total: int) -> str:
    listed = ", ".join(f"{task!r} ({count})" for task, count in list(skipped.items())[:_LISTED])
    more = f" and {len(skipped) - _LISTED} more" if len(skipped) > _LISTED else ""
    return (
        f"task_samples: {len(skipped)} of {total} tasks have fewer than support + query = "
        f"{support} + {query} = {support + query} transitions: {listed}{more}; expected at "
        "least that many per task. Lower support or query, remove those tasks from the "
        "dataset, or pass skip_small_tasks=True to leave them out (they are counted in "
        "TaskSamples.skipped_tasks)"
    )
