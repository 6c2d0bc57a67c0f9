"""``task_samples``: per task, K support and Q query transitions, disjoint.

Meta-learning datasets are small per task, so ``task_samples`` reads the selected
columns once into memory as ``TaskSamples`` (``pipeline.tasks.grouping``, where the
epoch's plan is described), through Ray Data; ``read_task_samples`` builds the same
samples in the process that calls it, reading the files with pyarrow (a Ray Train worker
reading its own share, with no Ray Data read behind it). Datasets larger than a memory
budget are read in windows of whole tasks instead (``TaskWindows``,
``pipeline.tasks.windows``). Either is handed to ``split_for_learners`` for meta-batch
streams.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract.schema import DatasetError
from pipeline.contract.value_checks import check_read_values
from pipeline.reads.episodes import DatasetInfo, Episodes, canonical_table
from pipeline.reads.returns import split_derived
from pipeline.streams.selection import check_modules, resolve_columns
from pipeline.tasks.episodes import EpisodeSupport, check_episode_sizes, episode_rows
from pipeline.tasks.grouping import (
    TaskSamples,
    check_task_sizes,
    group_rows,
    grouped_samples,
    no_rows_message,
    of_modules,
    read_names,
    sort_by_task,
    with_inputs,
)
from pipeline.tasks.windows import TaskWindows, estimated_bytes, plan_task_windows

_MODES = ("auto", "memory", "stream")

SortedRead = Callable[[Any, tuple[str, ...], frozenset[str] | None], pa.Table]
"""Reads the given columns of the rows of the given modules (None: all), sorted by task."""


def task_samples(
    episodes: Episodes | DatasetInfo,
    *,
    support: int | None = None,
    query: int,
    columns: Sequence[str] | None = None,
    modules_to_update: Collection[str] | None = None,
    skip_small_tasks: bool = False,
    mode: str = "auto",
    memory_budget_mb: float | None = None,
    gamma: float | None = None,
    episode_support: EpisodeSupport | None = None,
) -> TaskSamples | TaskWindows:
    """Per-task groups of ``episodes`` for K-support/Q-query sampling.

    ``mode="memory"`` reads the selected columns into memory (``TaskSamples``);
    ``mode="stream"`` plans windows of whole tasks that each epoch reads in turn, holding
    about ``memory_budget_mb`` at most (``TaskWindows``, see ``pipeline.tasks.windows``);
    ``mode="auto"`` streams when the selected columns would take more than
    ``memory_budget_mb`` in memory (never without a budget). Streaming reads the files with
    pyarrow, so it also takes the ``DatasetInfo`` of ``inspect_episodes`` (no Ray).

    Tasks with fewer than ``support + query`` transitions are refused with an error that
    lists them, or left out and listed in ``skipped_tasks`` with ``skip_small_tasks``.
    The shuffle seed is the stream's (``split_for_learners(seed=...)``): epoch ``e`` is
    planned from ``seed + e``. With ``gamma`` the samples also carry the columns derived
    at ingest (``returns``, ``returns_truncated``; see ``pipeline.reads.returns``), computed per
    whole episode in memory and per window when streaming (a window holds whole tasks).

    When validation did not scan every row's values (``check_values`` ``sample`` or
    ``off``), the rows read are refused if a float column holds NaN or inf
    (``pipeline.contract.value_checks.check_read_values``): in memory once, streamed once per
    window.

    With ``episode_support`` (``EpisodeSupport(E, window=W)``) a support set is E episodes
    of the task (whole, or W consecutive steps of each) and the query set Q transitions of
    its other episodes; ``support`` is then not given: K = E * steps
    (``pipeline.tasks.episodes``). A task with too few episodes is refused, or skipped with
    ``skip_small_tasks``.
    """
    reader = _read_sorted if isinstance(episodes, Episodes) else None
    return _sampled(
        episodes,
        reader,
        support=support,
        query=query,
        columns=columns,
        modules_to_update=modules_to_update,
        skip_small_tasks=skip_small_tasks,
        mode=mode,
        memory_budget_mb=memory_budget_mb,
        gamma=gamma,
        episode_support=episode_support,
    )


def read_task_samples(info: DatasetInfo, **options: Any) -> TaskSamples | TaskWindows:
    """``task_samples(info, **options)``, read in this process: in memory, ``info``'s files
    are read with pyarrow (Ray Data is not used), giving the ``TaskSamples`` that
    ``task_samples`` gives for ``read_episodes`` of the same files; streamed, the same
    ``TaskWindows``. What a Ray Train worker calls to read its own share."""
    return _sampled(info, _read_files_sorted, **options)


def _sampled(
    episodes: Episodes | DatasetInfo,
    reader: SortedRead | None,
    *,
    support: int | None = None,
    query: int,
    columns: Sequence[str] | None = None,
    modules_to_update: Collection[str] | None = None,
    skip_small_tasks: bool = False,
    mode: str = "auto",
    memory_budget_mb: float | None = None,
    gamma: float | None = None,
    episode_support: EpisodeSupport | None = None,
) -> TaskSamples | TaskWindows:
    if episode_support is not None and support is not None:
        raise ValueError(
            f"support={support!r} counts transitions, episode_support={episode_support!r} "
            "episodes: pass one of the two"
        )
    sizes = (
        {"query": query} if episode_support is not None else {"support": support, "query": query}
    )
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if memory_budget_mb is not None and not memory_budget_mb > 0:
        raise ValueError(f"memory_budget_mb must be > 0 (megabytes), got {memory_budget_mb!r}")
    if mode == "stream" and memory_budget_mb is None:
        raise ValueError(
            "mode='stream' needs memory_budget_mb: the windows of tasks are sized from it"
        )
    stored, derived = split_derived(columns, gamma)
    chosen = resolve_columns(episodes.schema, stored)
    read = with_inputs(chosen, derived)
    modules = check_modules(modules_to_update, tuple(episodes.module_ids))
    if memory_budget_mb is not None and (
        mode == "stream"
        or (mode == "auto" and estimated_bytes(episodes, read) > memory_budget_mb * 2**20)
    ):
        return plan_task_windows(
            episodes,
            support=support,
            query=query,
            columns=chosen,
            modules=modules,
            skip_small_tasks=skip_small_tasks,
            memory_budget_mb=memory_budget_mb,
            derived=derived,
            gamma=gamma,
            episode_support=episode_support,
        )
    if reader is None:
        raise TypeError(
            "task samples in memory are read through Ray: pass read_episodes(...), not "
            "inspect_episodes(...), or stream them (mode='stream' with memory_budget_mb)"
        )
    table = reader(episodes, read, modules)
    if not episodes.values.every_row:
        check_read_values(
            table, episodes.files, episodes.filesystem, episodes.schema, episodes.values
        )
    if table.num_rows == 0:
        raise DatasetError(no_rows_message(modules))
    groups = group_rows(table)
    if episode_support is not None:
        found = episode_rows(table.column("eps_id"), groups.offsets)
        lengths = {
            (module, task): found.lengths[found.group == g]
            for g, (module, task) in enumerate(zip(groups.modules, groups.tasks, strict=True))
        }
        skipped = check_episode_sizes(
            episode_support,
            lengths,
            query,
            skip_small_tasks=skip_small_tasks,
        )
    else:
        counts = np.diff(groups.offsets)
        skipped = check_task_sizes(
            groups.tasks, groups.modules, counts, support, query, skip_small_tasks
        )
    return grouped_samples(
        table,
        groups,
        support=support or 0,
        query=query,
        stored=chosen,
        derived=derived,
        gamma=gamma,
        module_ids=tuple(sorted(set(groups.modules))),
        skipped_tasks=skipped,
        fingerprint=getattr(episodes, "fingerprint", None),
        obs_layout=episodes.schema.obs_layout,
        episodes=episode_support,
    )


def _read_sorted(
    episodes: Episodes, columns: tuple[str, ...], modules: frozenset[str] | None
) -> pa.Table:
    from ray.data.expressions import col

    schema = episodes.schema
    dataset = episodes.dataset.select_columns(read_names(schema, columns))
    if modules is not None and schema.has_module_id:
        dataset = dataset.filter(expr=col("module_id").is_in(sorted(modules)))
    parts = list(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    if not parts:
        return pa.table({name: pa.array([], pa.int64()) for name in columns})
    return sort_by_task(pa.concat_tables(parts))


def _read_files_sorted(
    info: DatasetInfo, columns: tuple[str, ...], modules: frozenset[str] | None
) -> pa.Table:
    schema = info.schema
    names = read_names(schema, columns)
    on_disk = [schema.column_map.get(name, name) for name in names]
    parts = [
        canonical_table(info, pq.read_table(path, columns=on_disk, filesystem=info.filesystem))
        for path in info.files
    ]
    table = of_modules(pa.concat_tables(parts), schema, modules)
    return sort_by_task(table) if table.num_rows else table
