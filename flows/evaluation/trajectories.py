"""What the policies do on the held-out tasks: the data of ``rollouts.png``.

When the environment reports ``info["position"]``: up to four held-out tasks (spread by
goal angle when the environment also reports a 2-D ``info["goal"]``, else over the
evaluated order) and on each one episode of the unadapted meta-policy, of the policy
adapted on that task's support transitions and, when reported, of the expert, all from the
same start (``evaluation.seed``), with their paths and returns. For offline-RL data
(held-out episodes carrying a ``behavior`` column) also the recorded episodes of those
tasks: what the policies were learnt from.

Otherwise every evaluated task's mean return under each policy (``rollout_episodes``
episodes each).

Everything returned is plain JSON (``rollouts.json``); ``flows.evaluation.pictures`` draws it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from flows.config import EvaluationConfig
from flows.evaluation.rollouts import roll_out
from flows.evaluation.task_rollouts import TaskRollouts
from pipeline.io.arrow_columns import decoded
from pipeline.reads.episodes import Episodes
from pipeline.streams.columns import column_array
from pipeline.synthetic.point_robot_episodes import BEHAVIOR_COLUMN

GOALS_SHOWN = 4
"""Held-out tasks drawn as paths in ``rollouts.png`` (all of them when fewer were evaluated)."""
BEHAVIOR_EPISODES = 8
"""Recorded episodes drawn per task at most (the first by episode id)."""


def trajectories_of(
    rollouts: TaskRollouts, settings: EvaluationConfig, heldout: Episodes
) -> dict[str, Any]:
    """``rollouts.json`` for the evaluated tasks of ``rollouts`` (module docstring)."""
    policies = rollouts.policies
    head = {
        "environment": policies.envs.name,
        "adapt_steps": settings.rollout_adapt_steps,
        "seed": settings.seed,
    }
    first = rollouts.results["unadapted"]
    if first.positions is None:
        stats = rollouts.stats()
        return {
            **head,
            "episodes": settings.rollout_episodes,
            "tasks": [
                {
                    "task_id": task_id,
                    "returns": {name: s.task_returns[row] for name, s in stats.items()},
                }
                for row, task_id in enumerate(policies.task_ids)
            ],
        }
    goals = None if first.goals is None else first.goals[:: settings.rollout_episodes]
    chosen = _spread(goals, len(policies.task_ids))
    shown = [policies.task_ids[i] for i in chosen]
    envs = [policies.envs.make(task_id) for task_id in shown]
    episodes = {
        name: roll_out(envs, policy, seed=settings.seed, max_steps=settings.max_episode_steps)
        for name, policy in policies.policies(chosen).items()
    }
    for env in envs:
        env.close()
    behavior = _behavior_episodes(heldout, shown) if _has_behavior(heldout) else None
    return {
        **head,
        "goals": [
            {
                "task_id": task_id,
                "goal": None if goals is None else goals[chosen[row]].tolist(),
                "policies": {
                    name: {
                        "positions": run.positions[row].tolist(),
                        "return": float(run.returns[row]),
                    }
                    for name, run in episodes.items()
                },
                "behavior": None if behavior is None else behavior[task_id],
            }
            for row, task_id in enumerate(shown)
        ],
    }


def _spread(goals: np.ndarray | None, tasks: int) -> list[int]:
    """Tasks to draw: spread by goal angle when 2-D goals are known, else by task order."""
    if goals is not None and goals.shape[1:] == (2,):
        return _spread_goals(goals.tolist())
    picks = np.round(np.linspace(0, tasks - 1, min(GOALS_SHOWN, tasks))).astype(int)
    return list(dict.fromkeys(picks.tolist()))


def _spread_goals(goals: Sequence[Sequence[float]]) -> list[int]:
    """Indices of up to ``GOALS_SHOWN`` goals evenly spread by angle, in angle order."""
    angles = np.array([np.arctan2(y, x) for x, y in goals])
    order = np.argsort(angles, kind="stable")
    picks = np.round(np.linspace(0, len(order) - 1, min(GOALS_SHOWN, len(order)))).astype(int)
    return [int(order[p]) for p in dict.fromkeys(picks.tolist())]


def _has_behavior(heldout: Episodes) -> bool:
    """Whether recorded episodes can be drawn: labelled by behaviour, and observations that
    are the 2-D position the rollout paths show (the point robot's)."""
    schema = heldout.schema
    return (
        BEHAVIOR_COLUMN in schema.extra_columns and schema.has_task_id and schema.obs_shape == (2,)
    )


def _behavior_episodes(heldout: Episodes, task_ids: Sequence[str]) -> dict[str, list[dict]]:
    """The first ``BEHAVIOR_EPISODES`` recorded episodes of each task: positions (each
    step's ``obs``, then the last ``new_obs``), return and behaviour label."""
    from ray.data.expressions import col

    columns = ["task_id", "eps_id", "t", "obs", "rewards", BEHAVIOR_COLUMN]
    if heldout.schema.has_new_obs:
        columns.append("new_obs")
    selected = heldout.dataset.select_columns(columns)
    selected = selected.filter(expr=col("task_id").is_in(list(task_ids)))
    parts = list(selected.iter_batches(batch_size=None, batch_format="pyarrow"))
    found: dict[str, list[dict]] = {task_id: [] for task_id in task_ids}
    if not parts:
        return found
    table = pa.concat_tables(parts)
    keys = pa.table({name: decoded(table.column(name)) for name in ("task_id", "eps_id", "t")})
    table = table.take(
        pc.sort_indices(keys, sort_keys=[(n, "ascending") for n in keys.column_names])
    )
    task_of = decoded(table.column("task_id")).to_pylist()
    episode_of = table.column("eps_id").to_pylist()
    labels = decoded(table.column(BEHAVIOR_COLUMN)).to_pylist()
    obs = column_array(table, "obs")
    new_obs = column_array(table, "new_obs") if "new_obs" in table.column_names else None
    rewards = column_array(table, "rewards")
    keys = list(zip(task_of, episode_of, strict=True))
    starts = [0, *(i for i in range(1, len(keys)) if keys[i] != keys[i - 1])]
    for start, stop in zip(starts, [*starts[1:], len(keys)], strict=True):
        drawn = found[task_of[start]]
        if len(drawn) == BEHAVIOR_EPISODES:
            continue
        path = (
            obs[start:stop] if new_obs is None else np.vstack([obs[start:stop], new_obs[stop - 1]])
        )
        drawn.append(
            {
                "eps_id": episode_of[start],
                "behavior": labels[start],
                "positions": path.astype(float).tolist(),
                "return": float(rewards[start:stop].sum(dtype=np.float64)),
            }
        )
    return found
