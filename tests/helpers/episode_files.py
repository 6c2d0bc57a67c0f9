"""Tiny episode tables for dataset tests: canonical by default, any column replaceable."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def tensor(values: np.ndarray) -> pa.Array:
    return pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values, np.float32))


def fixed_list(values: np.ndarray) -> pa.Array:
    values = np.asarray(values, np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])


def episode_table(
    rows: int = 6,
    *,
    obs_dim: int = 3,
    action_dim: int | None = 2,
    episode_length: int = 3,
    tasks: tuple[str, ...] = ("a", "b"),
    seed: int = 0,
    first_episode: int = 0,
    **columns: Any,
) -> pa.Table:
    """``rows`` transitions in episodes of ``episode_length``, tasks assigned by episode.

    Episodes are numbered from ``first_episode`` (files of one dataset need distinct
    episodes). ``action_dim=None`` gives discrete int64 actions. Keyword arguments replace
    columns (an array) or drop them (``None``); new names add columns.
    """
    rng = np.random.default_rng(seed)
    eps = first_episode + np.arange(rows) // episode_length
    step = np.arange(rows) % episode_length
    if action_dim is None:
        actions = pa.array(rng.integers(0, 4, rows), pa.int64())
    else:
        actions = tensor(rng.normal(size=(rows, action_dim)))
    table = {
        "eps_id": pa.array(eps, pa.int64()),
        "t": pa.array(step, pa.int32()),
        "obs": tensor(rng.normal(size=(rows, obs_dim))),
        "actions": actions,
        "rewards": pa.array(rng.normal(size=rows), pa.float32()),
        "terminateds": pa.array(step == episode_length - 1),
        "truncateds": pa.array(np.zeros(rows, bool)),
        "task_id": pa.array([tasks[e % len(tasks)] for e in eps]).dictionary_encode(),
    }
    for name, value in columns.items():
        if value is None:
            table.pop(name)
        else:
            table[name] = value
    return pa.table(table)


def write(path: Path, table: pa.Table) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path)
    return path


def write_two_agents(directory: Path, bounds: list[int]) -> Path:
    """Rows ``bounds[0] .. bounds[-1]`` of two agents, ``m0`` and ``m1`` (alternating rows),
    in episodes of 5 steps each, one file per pair of consecutive bounds; ``rewards`` is the
    row number."""
    for part, (start, stop) in enumerate(itertools.pairwise(bounds)):
        ids = np.arange(start, stop)
        table = episode_table(
            stop - start,
            action_dim=None,
            tasks=("only",),
            eps_id=pa.array(ids // 10, pa.int64()),
            t=pa.array(ids % 10 // 2, pa.int32()),
            terminateds=pa.array(ids % 10 >= 8),
            rewards=pa.array(ids.astype(np.float32)),
            module_id=pa.array(np.where(ids % 2 == 0, "m0", "m1")).dictionary_encode(),
        )
        write(directory / f"part-{part}.parquet", table)
    return directory
