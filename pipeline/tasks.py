"""Task samples for meta-learning: per task, K support and Q query transitions, disjoint.

Meta-learning datasets are small per task, so ``task_samples`` reads the selected
columns once into memory, sorted by (module, task, episode, step) so that nothing
depends on file order, and remembers where each (module, task) group starts. Every epoch
is then planned in a few vectorised numpy calls from ``seed + epoch`` alone:

1. permute each task's rows, cut them into ``n // (K + Q)`` disjoint chunks, split each
   chunk into K support + Q query transitions (a transition is used at most once per
   epoch, support and query never overlap);
2. shuffle the samples of all tasks together;
3. meta-batch ``j`` of learner ``r`` out of ``W`` takes samples
   ``[(j * W + r) * M, (j * W + r + 1) * M)``.

Step 3 makes the learners' shares of step ``j`` together exactly the ``M * W`` samples a
single learner with meta-batches of ``M * W`` tasks gets at step ``j``: two workers with
M/2 tasks each compute the same averaged meta-gradient as one worker with M tasks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.batching import Batch, column_array, gather
from pipeline.epoch_sources import Deal, check_modules, resolve_columns
from pipeline.returns import INPUT_COLUMNS, returns_columns, split_derived
from pipeline.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, DatasetError

if TYPE_CHECKING:
    from pipeline.dataset import Episodes

_LISTED = 20
_DEAL_ROWS = 16384


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

    @property
    def samples_per_epoch(self) -> int:
        return int(self.group_samples.sum())

    def summary(self) -> dict[str, Any]:
        """Plain-JSON description for logs."""
        size = self.support + self.query
        counts = np.diff(self.group_offsets)
        return {
            "support": self.support,
            "query": self.query,
            "tasks": len(self.task_ids),
            "modules": list(self.module_ids),
            "rows": int(self.group_offsets[-1]),
            "samples_per_epoch": self.samples_per_epoch,
            "unused_rows_per_epoch": int((counts - self.group_samples * size).sum()),
            "skipped_tasks": len(self.skipped_tasks),
        }

    def epoch_plan(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Row indices ``[samples, K + Q]`` and module index ``[samples]`` of one epoch."""
        rng = np.random.default_rng(seed)
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
        size = self.support + self.query
        rows = np.stack(
            [
                rng.choice(np.arange(self.group_offsets[g], self.group_offsets[g + 1]), size, False)
                for g in groups[chosen]
            ]
        )
        (module,) = self.module_ids
        meta_batch: dict[str, Batch] = {
            part: {module: {name: gather(array, index) for name, array in self.arrays.items()}}
            for part, index in (
                ("support", rows[:, : self.support]),
                ("query", rows[:, self.support :]),
            )
        }
        return meta_batch, [self.task_ids[i] for i in chosen]


def task_samples(
    episodes: Episodes,
    *,
    support: int,
    query: int,
    columns: Sequence[str] | None = None,
    modules_to_update: Collection[str] | None = None,
    skip_small_tasks: bool = False,
    gamma: float | None = None,
) -> TaskSamples:
    """Read ``episodes`` into memory as per-task groups for K-support/Q-query sampling.

    Tasks with fewer than ``support + query`` transitions are refused with an error that
    lists them, or left out and listed in ``skipped_tasks`` with ``skip_small_tasks``.
    The shuffle seed is the stream's (``split_for_learners(seed=...)``): epoch ``e`` is
    planned from ``seed + e``. With ``gamma`` the samples also carry the columns derived
    at ingest (``returns``, ``returns_truncated``; see ``pipeline.returns``).
    """
    for name, value in (("support", support), ("query", query)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    schema = episodes.schema
    columns, derived = split_derived(columns, gamma)
    chosen = resolve_columns(schema, columns)
    read = (*chosen, *INPUT_COLUMNS) if derived else chosen
    table = _read_sorted(episodes, read, modules_to_update)
    if table.num_rows == 0:
        raise DatasetError(
            f"task_samples: no rows of modules {sorted(modules_to_update or [])} in the data"
        )
    modules = _strings(table, "module_id", DEFAULT_MODULE_ID)
    tasks = _strings(table, "task_id", DEFAULT_TASK_ID)
    changes = pc.or_(
        pc.not_equal(modules.slice(1), modules.slice(0, len(modules) - 1)),
        pc.not_equal(tasks.slice(1), tasks.slice(0, len(tasks) - 1)),
    )
    starts = np.concatenate(([0], np.flatnonzero(changes.to_numpy(zero_copy_only=False)) + 1))
    offsets = np.concatenate((starts, [table.num_rows]))
    group_tasks = tasks.take(pa.array(starts)).to_pylist()
    group_module_names = modules.take(pa.array(starts)).to_pylist()
    module_ids = tuple(sorted(set(group_module_names)))
    size = support + query
    counts = np.diff(offsets)
    small = counts < size
    labels = [
        task if len(module_ids) == 1 else f"{task} (module {module})"
        for task, module in zip(group_tasks, group_module_names, strict=True)
    ]
    skipped = {labels[g]: int(counts[g]) for g in np.flatnonzero(small)}
    if skipped and not skip_small_tasks:
        raise DatasetError(_small_tasks_message(skipped, support, query, len(labels)))
    if small.all():
        raise DatasetError(
            f"task_samples: every one of the {len(labels)} tasks has fewer than support + "
            f"query = {size} transitions (largest: {int(counts.max())}); lower support or query"
        )
    arrays = {name: column_array(table, name) for name in chosen}
    if derived:
        # Rows are in (module, task, episode, t) order: every episode is contiguous.
        arrays.update({k: v for k, v in returns_columns(table, gamma).items() if k in derived})
    return TaskSamples(
        support=support,
        query=query,
        columns=(*chosen, *derived),
        task_ids=tuple(sorted({t for t, s in zip(group_tasks, small, strict=True) if not s})),
        module_ids=module_ids,
        skipped_tasks=skipped,
        fingerprint=getattr(episodes, "fingerprint", None),
        arrays=arrays,
        group_offsets=offsets,
        group_modules=np.array([module_ids.index(m) for m in group_module_names]),
        group_samples=np.where(small, 0, counts // size),
    )


class TaskSource:
    """Meta-batches of ``tasks_per_batch`` task samples for the learners ``ranks``."""

    exact = True

    def __init__(
        self,
        samples: TaskSamples,
        *,
        tasks_per_batch: int,
        seed: int,
        ranks: Sequence[int],
        num_learners: int,
        pin_memory: bool,
    ) -> None:
        self._samples = samples
        self._tasks = tasks_per_batch
        self._seed = seed
        self._ranks = tuple(ranks)
        self._num_learners = num_learners
        self._pin_memory = pin_memory
        size = samples.support + samples.query
        self._per_deal = max(1, _DEAL_ROWS // (tasks_per_batch * size * len(self._ranks)))

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        rows, modules = self._samples.epoch_plan(self._seed + epoch)
        step = self._tasks * self._num_learners
        steps = len(rows) // step
        size = self._samples.support + self._samples.query
        total = int(self._samples.group_offsets[-1])
        per_batch = self._tasks * size
        for first in range(min(skip, steps), steps, self._per_deal):
            last = min(first + self._per_deal, steps)
            batches = [
                [
                    self._meta_batch(rows, modules, j * step + rank * self._tasks)
                    for j in range(first, last)
                ]
                for rank in self._ranks
            ]
            read = (last - first) * per_batch * len(self._ranks)
            # Transitions no learner gets this epoch: leftover samples, task remainders.
            dropped = total - steps * step * size if last == steps else 0
            yield Deal(batches, read, dropped)

    def describe_empty(self, epoch: int, rows: int) -> str:
        samples = self._samples
        return (
            f"epoch {epoch} has {samples.samples_per_epoch} task samples of "
            f"{samples.support} support + {samples.query} query transitions, fewer than one "
            f"meta-batch of {self._tasks} tasks for each of {self._num_learners} learner(s); "
            "lower minibatch_size, support or query, or add tasks"
        )

    def _meta_batch(self, rows: np.ndarray, modules: np.ndarray, start: int) -> dict[str, Batch]:
        picked = rows[start : start + self._tasks]
        picked_modules = modules[start : start + self._tasks]
        if len(self._samples.module_ids) > 1:
            by_module = np.argsort(picked_modules, kind="stable")
            picked, picked_modules = picked[by_module], picked_modules[by_module]
        bounds = np.searchsorted(picked_modules, np.arange(len(self._samples.module_ids) + 1))
        k = self._samples.support
        meta: dict[str, Batch] = {"support": {}, "query": {}}
        for part, index in (("support", picked[:, :k]), ("query", picked[:, k:])):
            tensors = {
                name: gather(array, index, self._pin_memory)
                for name, array in self._samples.arrays.items()
            }
            for code, module in enumerate(self._samples.module_ids):
                lo, hi = int(bounds[code]), int(bounds[code + 1])
                if hi > lo:
                    meta[part][module] = {name: t[lo:hi] for name, t in tensors.items()}
        return meta


def _read_sorted(
    episodes: Episodes, columns: tuple[str, ...], modules_to_update: Collection[str] | None
) -> pa.Table:
    from ray.data.expressions import col

    schema = episodes.schema
    ids = [name for name in ("module_id", "task_id") if getattr(schema, f"has_{name}")]
    dataset = episodes.dataset.select_columns(list(dict.fromkeys([*columns, *ids, "eps_id", "t"])))
    modules = check_modules(modules_to_update, tuple(episodes.module_ids))
    if modules is not None and schema.has_module_id:
        dataset = dataset.filter(expr=col("module_id").is_in(sorted(modules)))
    parts = list(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    if not parts:
        return pa.table({name: pa.array([], pa.int64()) for name in columns})
    table = pa.concat_tables(parts)
    keys = {name: _decoded(table.column(name)) for name in [*ids, "eps_id", "t"]}
    order = pc.sort_indices(pa.table(keys), sort_keys=[(name, "ascending") for name in keys])
    return table.take(order)


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def _strings(table: pa.Table, name: str, default: str) -> pa.Array:
    if name not in table.column_names:
        return pa.array([default] * table.num_rows, pa.string())
    return _decoded(table.column(name)).combine_chunks()


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
