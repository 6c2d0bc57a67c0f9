"""Minari episodes (T+1 rows each) as canonical transitions (T rows each), many at once.

Row ``i`` of an episode of T steps: ``obs`` = observations[i], ``new_obs`` =
observations[i + 1], ``actions``, ``rewards``, ``terminateds``/``truncateds`` from row ``i``
(the padding row T is dropped), ``infos`` (when recorded) from row ``i + 1``: the info the
step returned. Episodes are converted in groups with one gather per column: per-episode
Python work is what made small episodes slow.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from pipeline.contract.integer_range import fitting_cast
from pipeline.contract.schema import DatasetError
from pipeline.importers.columns import to_tensor

COLUMNS = ("observations", "actions", "rewards", "terminations", "truncations")
_FLAGS = {"terminations": "terminateds", "truncations": "truncateds"}


@dataclass(frozen=True)
class RawEpisode:
    """One episode as Minari stores it."""

    eps_id: int
    """The episode folder's name."""
    directory: Path
    table: pa.Table
    """T+1 rows (T >= 1)."""


def check_columns(raw: pa.Table, where: Path) -> None:
    """Refuse an episode without Minari's columns."""
    missing = [c for c in COLUMNS if c not in raw.column_names]
    if missing:
        raise DatasetError(
            f"{where}: column '{missing[0]}' is missing (found {', '.join(raw.column_names)}); "
            f"expected Minari's episode columns {', '.join(COLUMNS)}"
        )


def canonical_episodes(
    episodes: list[RawEpisode], spaces: dict[str, dict[str, Any]], task: str
) -> pa.Table:
    """The transitions of ``episodes`` (same schema, in id order) in canonical columns."""
    raw = pa.concat_tables([e.table for e in episodes])
    where = f"{episodes[0].directory} (and the next {len(episodes) - 1} episode folders)"
    lengths = np.array([e.table.num_rows for e in episodes])
    steps = lengths - 1
    keep = np.ones(len(raw), dtype=bool)
    keep[np.cumsum(lengths) - 1] = False  # each episode's padding row
    kept = np.flatnonzero(keep)
    # Step index within its episode, and the position of each kept row's episode.
    episode_of = np.repeat(np.arange(len(episodes)), steps)
    t = np.arange(len(kept)) - np.repeat(np.cumsum(steps) - steps, steps)
    obs_shape = _shape(spaces["observation_space"])
    observations = to_tensor(
        raw.column("observations"), raw.schema.field("observations"), where=where, shape=obs_shape
    )
    rows, following = pa.array(kept), pa.array(kept + 1)
    columns: dict[str, pa.Array] = {
        "eps_id": pa.array(np.repeat([e.eps_id for e in episodes], steps).astype(np.int64)),
        "t": pa.array(t.astype(np.int32)),
        "obs": observations.take(rows),
        "actions": _actions(raw, spaces["action_space"], where).take(rows),
        "rewards": fitting_cast(
            raw.column("rewards"), pa.float32(), where=where, label="'rewards'"
        ).take(rows),
    }
    last_step = t == np.repeat(steps, steps) - 1
    for source, name in _FLAGS.items():
        flags = raw.column(source).take(rows)
        early = np.flatnonzero(flags.to_numpy(zero_copy_only=False) & ~last_step)
        if len(early):
            episode = episodes[episode_of[early[0]]]
            raise DatasetError(
                f"{episode.directory}: column '{source}' is set at step {int(t[early[0]])} of "
                f"{episode.table.num_rows - 1}; expected an episode to end only at its last step"
            )
        columns[name] = flags
    columns["new_obs"] = observations.take(following)
    columns["task_id"] = pa.array([task] * len(kept), pa.string())
    if "infos" in raw.column_names and raw.schema.field("infos").type.num_fields:
        columns["infos"] = raw.column("infos").take(following)
    return pa.table(columns)


def _actions(raw: pa.Table, space: dict[str, Any], where: str) -> pa.Array:
    column = raw.column("actions")
    if space["type"] == "Discrete":
        return fitting_cast(column, pa.int64(), where=where, label="'actions'").combine_chunks()
    return to_tensor(column, raw.schema.field("actions"), where=where, shape=_shape(space))


def _shape(space: dict[str, Any]) -> tuple[int, ...] | None:
    return tuple(space.get("shape") or ()) or None
