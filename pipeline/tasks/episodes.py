"""Support sets made of episodes: ``task_samples(..., episodes=EpisodeSupport(E, W))``.

A sample's support set is E episodes of its task, the query set Q transitions drawn from
the task's *other* episodes, so support and query never share an episode. Vmap needs one
shape for every sample, ``[M, K, ...]``, so each support episode gives the same number of
steps and ``K = E * steps``:

- without a window, whole episodes, and every episode sampled must have the same length
  L (``steps = L``; fixed-horizon data such as the point robot and Meta-World); episodes of
  different lengths are refused, pointing at the window;
- with ``window=W``, W consecutive steps of each support episode, starting at a step drawn
  uniformly (``steps = W``); episodes shorter than W are never support (they may be query).

No padding and no mask: every row of a support set is a real transition, so the learners'
losses need nothing new.

Each epoch (``plan_episode_samples``, from the epoch's generator alone): the usable
episodes of each task are shuffled and cut into groups of E, one sample each (an episode is
support at most once per epoch; ``usable % E`` are left out); each sample's Q query rows are
drawn without replacement from the rows of the task outside its own support episodes. A
task is too small when it has fewer than E usable episodes, or when its rows outside its E
longest usable episodes are fewer than Q (then some draw would not find Q query rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, DatasetError
from pipeline.io.arrow_columns import decoded
from pipeline.reads.episodes import DatasetInfo

_LISTED = 20


@dataclass(frozen=True)
class EpisodeSupport:
    """E support episodes per sample, whole or W consecutive steps of each."""

    episodes: int
    """E: episodes in a support set."""
    window: int | None = None
    """W: consecutive steps of each support episode; None: whole episodes (one length)."""

    def __post_init__(self) -> None:
        for name, value in (("episodes", self.episodes), ("window", self.window)):
            if value is None and name == "window":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"EpisodeSupport.{name} must be an int >= 1, got {value!r}")

    def describe(self) -> dict[str, int | str | None]:
        """Plain JSON for summaries and reports."""
        return {"support_from": "episodes", "episodes": self.episodes, "window": self.window}


class EpisodeRows(NamedTuple):
    """Where the episodes of a table sorted by (module, task, eps_id, t) are."""

    starts: np.ndarray
    """First row of each episode, ``[episodes]``."""
    lengths: np.ndarray
    group: np.ndarray
    """The (module, task) group of each episode."""


def episode_rows(eps_ids: pa.ChunkedArray | pa.Array, group_offsets: np.ndarray) -> EpisodeRows:
    """The episodes of sorted rows with episode ids ``eps_ids`` and groups ``group_offsets``."""
    ids = decoded(eps_ids)
    rows = len(ids)
    changed = np.zeros(rows, dtype=bool)
    if rows > 1:
        changed[1:] = pc.not_equal(ids.slice(1), ids.slice(0, rows - 1)).to_numpy(
            zero_copy_only=False
        )
    changed[group_offsets[:-1][group_offsets[:-1] < rows]] = True
    starts = np.flatnonzero(changed)
    lengths = np.diff(np.append(starts, rows))
    group = np.searchsorted(group_offsets, starts, side="right") - 1
    return EpisodeRows(starts, lengths, group)


def episode_steps(
    support: EpisodeSupport,
    lengths: np.ndarray,
    where: str,
    window_key: str = "tasks.support_window: W, or EpisodeSupport(window=W)",
) -> int:
    """Steps each support episode gives: the window, or the one length of every episode
    (``lengths``) for whole episodes, refused when they differ (``window_key``: the setting
    that would take a window instead, as the caller words it)."""
    if support.window is not None:
        return support.window
    shortest, longest = int(lengths.min()), int(lengths.max())
    if shortest != longest:
        raise DatasetError(
            f"{where}: whole episodes as support sets need every episode to have one length "
            f"(vmap stacks them), but the episodes have {shortest} to {longest} steps; take W "
            f"consecutive steps of each support episode instead ({window_key})"
        )
    return shortest


def usable(support: EpisodeSupport, lengths: np.ndarray) -> np.ndarray:
    """Which episodes can be support: every one for whole episodes, those of at least W
    steps with a window."""
    if support.window is None:
        return np.ones(len(lengths), dtype=bool)
    return lengths >= support.window


def group_samples(
    support: EpisodeSupport, episodes: EpisodeRows, group_rows: np.ndarray, query: int
) -> tuple[np.ndarray, np.ndarray]:
    """Samples each group gives per epoch (0 for a small group) and usable episodes per
    group."""
    groups = len(group_rows)
    ok = usable(support, episodes.lengths)
    counts = np.bincount(episodes.group[ok], minlength=groups)
    samples = np.zeros(groups, dtype=np.int64)
    for g in np.flatnonzero(counts >= support.episodes):
        lengths = np.sort(episodes.lengths[(episodes.group == g) & ok])[::-1]
        if group_rows[g] - lengths[: support.episodes].sum() >= query:
            samples[g] = counts[g] // support.episodes
    return samples, counts


def task_samples_of(support: EpisodeSupport, lengths: np.ndarray, query: int) -> tuple[int, int]:
    """Samples per epoch (0: too small) and usable episodes of one task whose episodes have
    ``lengths``."""
    zeros = np.zeros(len(lengths), dtype=np.int64)
    found = EpisodeRows(zeros, lengths, zeros)
    samples, usable_counts = group_samples(support, found, np.array([lengths.sum()]), query)
    return int(samples[0]), int(usable_counts[0])


def plan_episode_samples(
    rng: np.random.Generator,
    support: EpisodeSupport,
    steps: int,
    query: int,
    episodes: EpisodeRows,
    group_offsets: np.ndarray,
    samples_per_group: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One epoch's rows ``[samples, E * steps + Q]`` (support first) and each sample's group,
    samples in group order (see the module)."""
    e = support.episodes
    ok = np.flatnonzero(usable(support, episodes.lengths))
    # Usable episodes grouped by task (as stored), in random order within a task.
    shuffled = ok[np.lexsort((rng.random(len(ok)), episodes.group[ok]))]
    per_group = np.bincount(episodes.group[ok], minlength=len(samples_per_group))
    first = np.cumsum(per_group) - per_group
    sample_group = np.repeat(np.arange(len(samples_per_group)), samples_per_group)
    first_sample = np.cumsum(samples_per_group) - samples_per_group
    within = np.arange(len(sample_group)) - first_sample[sample_group]
    chosen = shuffled[(first[sample_group] + within * e)[:, None] + np.arange(e)]  # [S, E]
    starts, lengths = episodes.starts[chosen], episodes.lengths[chosen]
    if support.window is not None:
        starts = starts + np.floor(rng.random(chosen.shape) * (lengths - steps + 1)).astype(int)
    support_rows = (starts[..., None] + np.arange(steps)).reshape(len(chosen), e * steps)
    query_rows = _query_rows(rng, query, episodes, chosen, group_offsets, sample_group)
    return np.concatenate((support_rows, query_rows), axis=1), sample_group


def _query_rows(
    rng: np.random.Generator,
    query: int,
    episodes: EpisodeRows,
    chosen: np.ndarray,
    group_offsets: np.ndarray,
    sample_group: np.ndarray,
) -> np.ndarray:
    """``[S, Q]`` distinct rows of each sample's task outside its support episodes."""
    base = group_offsets[sample_group]
    order = np.argsort(episodes.starts[chosen], axis=1)
    excluded_starts = np.take_along_axis(episodes.starts[chosen], order, axis=1) - base[:, None]
    excluded_lengths = np.take_along_axis(episodes.lengths[chosen], order, axis=1)
    others = np.diff(group_offsets)[sample_group] - excluded_lengths.sum(axis=1)
    # Floyd's draw of Q distinct positions in [0, others) per sample. The uniforms of all
    # rounds come in one call (the same stream as one call per round). The rounds then run
    # per sample over a set, which beats Q rounds of numpy calls over all samples below some
    # hundred samples an epoch (Q = 50: 0.07 against 0.3 ms for reach's sample, one
    # meta-batch an epoch) and trails them above (2.1 against 0.9 ms for 240).
    tops = others[None, :] - query + np.arange(query)[:, None]  # [Q, samples]
    draws = np.floor(rng.random((query, len(chosen))) * (tops + 1)).astype(np.int64)
    picked = np.array(
        [_floyd(d, t) for d, t in zip(draws.T.tolist(), tops.T.tolist(), strict=True)],
        dtype=np.int64,
    ).reshape(len(chosen), query)
    picked.sort(axis=1)
    # Positions among the other rows -> rows: skip each support episode, in row order.
    for start, length in zip(excluded_starts.T, excluded_lengths.T, strict=True):
        picked += np.where(picked >= start[:, None], length[:, None], 0)
    return base[:, None] + picked


def _floyd(draws: list[int], tops: list[int]) -> list[int]:
    """Floyd's rounds for one sample: round ``i`` keeps its draw unless an earlier round
    picked it, and then takes its top (``tops`` rise, so no earlier round picked that)."""
    seen: set[int] = set()
    picked = []
    for draw, top in zip(draws, tops, strict=True):
        value = top if draw in seen else draw
        seen.add(value)
        picked.append(value)
    return picked


def check_episode_sizes(
    support: EpisodeSupport,
    groups: Mapping[tuple[str, str], np.ndarray],
    query: int,
    *,
    skip_small_tasks: bool,
    where: str = "task_samples",
    keys: str = "episode_support or query",
    skip: str = "skip_small_tasks=True",
) -> dict[str, int]:
    """The (module, task) groups (-> their episodes' lengths) too small for one sample ->
    their rows, in group order; refused in one line unless ``skip_small_tasks``, and always
    when every group is small. ``where``, ``keys`` and ``skip`` word the message for the
    caller (the data, the settings to lower and the one that skips): by default in
    ``task_samples``'s arguments, as both of its paths (in memory, task windows) say it."""
    several = len({module for module, _ in groups}) > 1
    small: dict[str, tuple[int, int, int]] = {}
    for (module, task), lengths in groups.items():
        samples, found = task_samples_of(support, lengths, query)
        if not samples:
            label = f"{task} (module {module})" if several else task
            small[label] = (found, len(lengths), int(lengths.sum()))
    if small and (not skip_small_tasks or len(small) == len(groups)):
        raise DatasetError(_too_few_message(where, small, len(groups), support, query, keys, skip))
    return {label: rows for label, (_, _, rows) in small.items()}


def _too_few_message(
    where: str,
    small: dict[str, tuple[int, int, int]],
    total: int,
    support: EpisodeSupport,
    query: int,
    keys: str,
    skip: str,
) -> str:
    e = support.episodes
    shown = [
        f"{task!r} ({found} of {episodes} episodes usable, {rows} rows)"
        for task, (found, episodes, rows) in list(small.items())[:_LISTED]
    ]
    more = f" and {len(small) - _LISTED} more" if len(small) > _LISTED else ""
    kind = "" if support.window is None else f" of at least {support.window} steps"
    every = f"every one of its {total} tasks has" if len(small) == total else None
    return (
        f"{where}: {every or f'{len(small)} of {total} tasks have'} too few episodes for "
        f"support sets of {e} "
        f"episode{'s' * (e > 1)}{kind} and {query} query transitions from other episodes: "
        f"{', '.join(shown)}{more}; expected at least {e} usable episodes per task and at "
        f"least {query} rows outside its {e} longest. Lower {keys}, remove those tasks"
        + (f", or leave them out ({skip})" if len(small) < total else "")
    )


def episode_lengths(
    info: DatasetInfo, modules: frozenset[str] | list[str] | None
) -> dict[tuple[str, str], np.ndarray]:
    """``(module, task)`` -> its episodes' lengths (in eps_id order), for ``modules`` (None:
    all), from the id columns only, a row group at a time."""
    schema = info.schema
    ids = {
        canonical: schema.column_map.get(canonical, canonical)
        for canonical in ("module_id", "task_id", "eps_id")
        if canonical == "eps_id" or getattr(schema, f"has_{canonical}")
    }
    counts: Counter[tuple[str, str, object]] = Counter()
    for table in _id_row_groups(info, list(ids.values())):
        columns = {name: decoded(table.column(ids[name])) for name in ids}
        counted = pa.table(columns).group_by(list(ids)).aggregate([([], "count_all")])
        size = counted.num_rows
        module = _values(counted, "module_id", DEFAULT_MODULE_ID, size)
        task = _values(counted, "task_id", DEFAULT_TASK_ID, size)
        eps = counted.column("eps_id").to_pylist()
        for key, count in zip(
            zip(module, task, eps, strict=True),
            counted.column("count_all").to_pylist(),
            strict=True,
        ):
            counts[key] += count
    grouped: dict[tuple[str, str], list[tuple[object, int]]] = {}
    for (module, task, eps), count in counts.items():
        if modules is None or module in modules:
            grouped.setdefault((module, task), []).append((eps, count))
    return {
        key: np.array([count for _, count in sorted(grouped[key], key=lambda pair: pair[0])])
        for key in sorted(grouped)
    }


def _values(table: pa.Table, name: str, default: str, size: int) -> list[str]:
    if name not in table.column_names:
        return [default] * size
    return table.column(name).to_pylist()


def _id_row_groups(info: DatasetInfo, columns: list[str]) -> Iterator[pa.Table]:
    for path in info.files:
        with info.filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=columns)
