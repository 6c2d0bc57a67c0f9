"""What task sampling and evaluation would refuse, decided before anything trains.

The train stage cuts every task of the train dataset into samples of ``tasks.support +
tasks.query`` transitions and deals ``tasks.meta_batch`` of them per meta-step to each
learner; evaluation draws one such sample from each held-out task, of one module, and
rolls the tasks out in their environment (``flows.evaluation.environments``: the env
factory must import and every task needs its parameters); ``tasks.mode: stream`` needs the
data sorted by task and every task within a window of ``tasks.memory_budget_mb``. Each of
these is decided here from the footers, the id columns and ``dataset.json``, without Ray,
so ``offmeta run`` refuses a mistake in a few seconds, in the config's own words, instead
of after Ray and Prefect start (or after training, for the held-out checks).

``check_task_sampling`` runs them all (``flows.stages.datasets`` calls it with its other
checks); the stages keep their own checks for callers that skip this one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from flows.config import MetaTrainConfig
from flows.evaluation.environments import heldout_envs
from pipeline.contract.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, DatasetError
from pipeline.io.arrow_columns import decoded

if TYPE_CHECKING:
    from pipeline.reads.episodes import Episodes
    from pipeline.tasks.grouping import TaskSamples
    from pipeline.tasks.windows import TaskWindows
from pipeline.reads.episodes import DatasetInfo
from pipeline.tasks.episodes import (
    EpisodeSupport,
    check_episode_sizes,
    episode_lengths,
    episode_steps,
    task_samples_of,
)

_LISTED = 5
_SIZE = "tasks.support + tasks.query"


def check_task_sampling(cfg: MetaTrainConfig, train: DatasetInfo, heldout: DatasetInfo) -> None:
    """Refuse, with ``DatasetError`` naming the dataset and the config keys, what the train
    and evaluation stages would refuse of ``train`` and ``heldout`` under ``cfg``."""
    modules = cfg.learners.data_modules
    episodes = episode_support(cfg)
    if episodes is None:
        sizes = _group_sizes(train, modules)
        _check_sizes(cfg, f"train dataset {train.root}", sizes)
        _check_meta_batch(cfg, f"train dataset {train.root}", sizes)
        _check_sizes(cfg, f"held-out dataset {heldout.root}", _group_sizes(heldout, modules))
    else:
        lengths = episode_lengths(train, modules)
        samples = _check_episodes(cfg, episodes, f"train dataset {train.root}", lengths)
        _check_meta_batch(cfg, f"train dataset {train.root}", samples)
        where = f"held-out dataset {heldout.root}"
        context = heldout_episode_support(cfg)
        assert context is not None  # of episodes whenever training's are
        _check_episodes(cfg, context, where, episode_lengths(heldout, modules), heldout=True)
    _check_windows(cfg, train)
    _check_evaluation(cfg, heldout)


def episode_support(cfg: MetaTrainConfig) -> EpisodeSupport | None:
    """The support sets of episodes ``cfg.tasks`` asks for (None: of transitions)."""
    tasks = cfg.tasks
    if tasks.support_from != "episodes":
        return None
    return EpisodeSupport(tasks.support_episodes, window=tasks.support_window)


def heldout_episode_support(cfg: MetaTrainConfig) -> EpisodeSupport | None:
    """A held-out task's context episodes: training's (``episode_support``) with the steps
    of ``evaluation.context_window`` when it is set (``whole``: whole episodes)."""
    episodes = episode_support(cfg)
    window = cfg.evaluation.context_window
    if episodes is None or window is None:
        return episodes
    return EpisodeSupport(episodes.episodes, window=None if window == "whole" else window)


def support_options(cfg: MetaTrainConfig, *, heldout: bool = False) -> dict[str, Any]:
    """The ``task_samples`` keywords of what a support set is in training, or with
    ``heldout`` in a held-out task's context."""
    episodes = heldout_episode_support(cfg) if heldout else episode_support(cfg)
    if episodes is None:
        return {"support": cfg.tasks.support, "query": cfg.tasks.query}
    return {"episode_support": episodes, "query": cfg.tasks.query}


def context_samples(
    cfg: MetaTrainConfig, data: Episodes, modules: Sequence[str]
) -> TaskSamples | TaskWindows:
    """``data``'s task samples of ``modules`` with a held-out task's context as support set
    (``support_options`` with ``heldout``): what held-out evaluation adapts on, and what the
    library of online exploration adapts its training tasks' policies on."""
    from pipeline.tasks.samples import task_samples

    return task_samples(
        data,
        **support_options(cfg, heldout=True),
        modules_to_update=modules,
        skip_small_tasks=cfg.tasks.skip_small_tasks,
        gamma=cfg.data.gamma,
    )


def _check_episodes(
    cfg: MetaTrainConfig,
    episodes: EpisodeSupport,
    where: str,
    lengths: dict[tuple[str, str], np.ndarray],
    *,
    heldout: bool = False,
) -> dict[tuple[str, str], int]:
    """Episode support sets: one episode length (whole episodes) and enough episodes per
    task; the samples each task gives per epoch. ``heldout``: the held-out contexts, whose
    steps ``evaluation.context_window`` may set."""
    if not lengths:
        return {}  # no rows of the modules read: flows.stages.datasets says so
    tasks = cfg.tasks
    window_key = "tasks.support_window"
    if heldout and cfg.evaluation.context_window is not None:
        window_key = "evaluation.context_window"
    keys = "tasks.support_episodes or tasks.query"
    if episodes.window is not None:
        keys = f"tasks.support_episodes, {window_key} or tasks.query"
    episode_steps(
        episodes, np.concatenate(list(lengths.values())), where, window_key=f"{window_key}: W"
    )
    check_episode_sizes(
        episodes,
        lengths,
        tasks.query,
        skip_small_tasks=tasks.skip_small_tasks,
        where=where,
        keys=keys,
        skip="tasks.skip_small_tasks: true",
    )
    return {key: task_samples_of(episodes, found, tasks.query)[0] for key, found in lengths.items()}


def _group_sizes(info: DatasetInfo, modules: list[str]) -> dict[tuple[str, str], int]:
    """``(module, task)`` -> transitions, for the modules the learner reads; only the id
    columns are read, a row group at a time, so memory holds one row group and the counts
    whatever the row count. With ``data.episodes_where``, the rows of the episodes kept
    (counted by the selection's own pass)."""
    if info.selection is not None:
        return {key: n for key, n in info.selection.sizes.items() if key[0] in modules}
    schema = info.schema
    ids = {
        canonical: schema.column_map.get(canonical, canonical)
        for canonical in ("module_id", "task_id")
        if getattr(schema, f"has_{canonical}")
    }
    if not ids:
        return {(DEFAULT_MODULE_ID, DEFAULT_TASK_ID): info.num_rows}
    sizes: Counter[tuple[str, str]] = Counter()
    for table in _id_row_groups(info, list(ids.values())):
        columns = {name: decoded(table.column(ids[name])) for name in ids}
        counted = pa.table(columns).group_by(list(ids)).aggregate([([], "count_all")])
        module = counted.column("module_id").to_pylist() if "module_id" in ids else None
        task = counted.column("task_id").to_pylist() if "task_id" in ids else None
        for row, count in enumerate(counted.column("count_all").to_pylist()):
            key = (
                module[row] if module is not None else DEFAULT_MODULE_ID,
                task[row] if task is not None else DEFAULT_TASK_ID,
            )
            sizes[key] += count
    return {key: count for key, count in sorted(sizes.items()) if key[0] in modules}


def _id_row_groups(info: DatasetInfo, columns: list[str]) -> Iterator[pa.Table]:
    for path in info.files:
        with info.filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=columns)


def _check_sizes(cfg: MetaTrainConfig, where: str, sizes: dict[tuple[str, str], int]) -> None:
    if not sizes:
        return  # no rows of the modules read: flows.stages.datasets says so
    tasks = cfg.tasks
    size = tasks.support + tasks.query
    sum_shown = f"{_SIZE} = {tasks.support} + {tasks.query} = {size}"
    if all(count < size for count in sizes.values()):
        raise DatasetError(
            f"{where}: every one of its {len(sizes)} tasks has fewer than {sum_shown} "
            f"transitions (largest: {max(sizes.values())}); lower tasks.support or tasks.query"
        )
    if tasks.skip_small_tasks:
        return
    several = len({module for module, _ in sizes}) > 1
    small = [
        (f"{task} (module {module})" if several else task, count)
        for (module, task), count in sizes.items()
        if count < size
    ]
    if small:
        listed = ", ".join(f"{task!r} ({count})" for task, count in small[:_LISTED])
        more = f" and {len(small) - _LISTED} more" if len(small) > _LISTED else ""
        raise DatasetError(
            f"{where}: {len(small)} of {len(sizes)} tasks have fewer than {sum_shown} "
            f"transitions: {listed}{more}; expected at least that many per task. Lower "
            "tasks.support or tasks.query, remove those tasks from the dataset, or set "
            "tasks.skip_small_tasks to true to leave them out"
        )


def _check_meta_batch(cfg: MetaTrainConfig, where: str, sizes: dict[tuple[str, str], int]) -> None:
    """Enough samples per epoch for one meta-batch per learner (exact for in-memory samples;
    streamed windows can fall short of it even so). ``sizes``: each task's transitions, or,
    for support sets of episodes, its samples."""
    tasks = cfg.tasks
    size = tasks.support + tasks.query
    if episode_support(cfg) is None:
        samples = sum(count // size for count in sizes.values())
        what, lower = f"{_SIZE} = {size} transitions", "tasks.support or tasks.query"
    else:
        samples = sum(sizes.values())
        what = f"tasks.support_episodes = {tasks.support_episodes} episodes"
        lower = "tasks.support_episodes"
    learners = max(1, cfg.learners.num_learners)
    if samples >= tasks.meta_batch * learners:
        return
    each = f" for each of {learners} learners (learners.num_learners)" if learners > 1 else ""
    raise DatasetError(
        f"{where}: its tasks give {samples} samples of {what} per epoch, fewer than one "
        f"meta-batch of tasks.meta_batch = {tasks.meta_batch} samples{each}; lower "
        f"tasks.meta_batch, {lower}, or add tasks"
    )


def sampling_options(cfg: MetaTrainConfig) -> dict[str, Any]:
    """The ``task_samples`` keywords a run's config asks for (the train stage's, and the
    plan these checks make of it)."""
    tasks = cfg.tasks
    return {
        **support_options(cfg),
        "modules_to_update": cfg.learners.data_modules,
        "skip_small_tasks": tasks.skip_small_tasks,
        "gamma": cfg.data.gamma,
        "mode": tasks.mode,
        "memory_budget_mb": tasks.memory_budget_mb,
    }


def _check_windows(cfg: MetaTrainConfig, train: DatasetInfo) -> None:
    """When the train stage would stream its task samples, plan the windows of tasks as it
    does (footers and id columns): refuses data not sorted by task and a task larger than
    a window of ``tasks.memory_budget_mb``."""
    from pipeline.reads.returns import split_derived
    from pipeline.streams.selection import resolve_columns
    from pipeline.tasks.grouping import with_inputs
    from pipeline.tasks.samples import task_samples
    from pipeline.tasks.windows import estimated_bytes

    tasks = cfg.tasks
    if tasks.mode == "memory":
        return
    if tasks.mode == "auto":
        # task_samples' choice for the columns the train stage reads (its defaults).
        stored, derived = split_derived(None, cfg.data.gamma)
        read = with_inputs(resolve_columns(train.schema, stored), derived)
        if estimated_bytes(train, read) <= tasks.memory_budget_mb * 2**20:
            return
    task_samples(train, **{**sampling_options(cfg), "mode": "stream"})


def _check_evaluation(cfg: MetaTrainConfig, heldout: DatasetInfo) -> None:
    modules = cfg.learners.data_modules
    if len(modules) != 1:
        raise DatasetError(
            f"held-out evaluation supports one module per dataset for now, but learners.modules "
            f"trains on the rows of modules {modules}; expected one (learners.modules_to_update "
            "names the modules to train)"
        )
    envs = heldout_envs(cfg, heldout)
    if envs is None and cfg.evaluation.context == "online":
        raise DatasetError(
            f"held-out dataset {heldout.root}: evaluation.context is online (exploration "
            "episodes in each held-out task's environment), but it has no environment: set "
            "evaluation.env to its env factory, or evaluation.context to offline"
        )
