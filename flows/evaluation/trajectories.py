"""What the policies do on a few held-out goals: the data of ``rollouts.png``.

For environments the evaluation can roll out (point_robot), four held-out goals spread
over the evaluated ones (by goal angle), and on each one episode of the unadapted
meta-policy, of the policy adapted on that task's support transitions (the evaluation's
inner rule and ``rollout_adapt_steps``) and of the noise-free expert, all from the same
start (``evaluation.seed``), with their returns. For offline-RL data (held-out episodes
carrying a ``behavior`` column) also the recorded episodes of those tasks: what the
policies were learnt from.

Everything returned is plain JSON (``rollouts.json``); ``flows.evaluation.pictures`` draws it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch.func import functional_call

from flows.config import EvaluationConfig
from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from learners.models.factory import build_models
from pipeline.io.arrow_columns import decoded
from pipeline.reads.episodes import Episodes
from pipeline.streams.collate import column_array
from pipeline.synthetic.point_robot import expert_actions, rollout_paths
from pipeline.synthetic.point_robot_episodes import BEHAVIOR_COLUMN

GOALS_SHOWN = 4
"""Held-out goals in ``rollouts.png`` (all of them when fewer were evaluated)."""
BEHAVIOR_EPISODES = 8
"""Recorded episodes drawn per goal at most (the first by episode id)."""


def point_robot_trajectories(
    learner: MetaLearner,
    meta_batch: Mapping[str, Any],
    task_ids: Sequence[str],
    tasks: Sequence[Mapping[str, Any]],
    settings: EvaluationConfig,
    heldout: Episodes,
) -> dict[str, Any]:
    """``rollouts.json`` for the evaluated ``task_ids`` (rows of ``meta_batch``) whose
    ``dataset.json`` parameters are ``tasks``."""
    chosen = _spread_goals([t["goal"] for t in tasks])
    goals = np.array([tasks[i]["goal"] for i in chosen], dtype=np.float64)
    # The policy: the module that reads its own rows (MACAW's value module reads the
    # policy's and has no actions to roll out).
    (module,) = learner.config.data_modules
    spec = learner.config.modules[module]
    model = build_models({module: spec}, seed=0)[module].to(learner.device)
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    support = meta_batch["support"]
    adapted = [
        learner.adapt(None, task_slice(support, i), steps=settings.rollout_adapt_steps)[module]
        for i in chosen
    ]
    dtype = next(iter(meta.values())).dtype

    def act(params: Mapping[str, torch.Tensor], obs: np.ndarray) -> np.ndarray:
        inputs = torch.from_numpy(obs).to(device=learner.device, dtype=dtype)
        with torch.no_grad():
            out = functional_call(model, dict(params), (inputs,))
        return (out["mean"] if isinstance(out, dict) else out).cpu().numpy()

    def adapted_policy(obs: np.ndarray) -> np.ndarray:
        return np.concatenate([act(adapted[row], obs[row : row + 1]) for row in range(len(obs))])

    expert_rng = np.random.default_rng(settings.seed)
    policies = {
        "unadapted": lambda obs: act(meta, obs),
        "adapted": adapted_policy,
        "expert": lambda obs: expert_actions(
            obs, goals, expert_rng, noise_std=0.0, random_fraction=0.0
        ),
    }
    episodes = {name: rollout_paths(p, goals, seed=settings.seed) for name, p in policies.items()}
    shown = [task_ids[i] for i in chosen]
    behavior = _behavior_episodes(heldout, shown) if _has_behavior(heldout) else None
    return {
        "environment": "point_robot",
        "adapt_steps": settings.rollout_adapt_steps,
        "seed": settings.seed,
        "goals": [
            {
                "task_id": task_id,
                "goal": goals[row].tolist(),
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


def _spread_goals(goals: Sequence[Sequence[float]]) -> list[int]:
    """Indices of up to ``GOALS_SHOWN`` goals evenly spread by angle, in angle order."""
    angles = np.array([np.arctan2(y, x) for x, y in goals])
    order = np.argsort(angles, kind="stable")
    picks = np.round(np.linspace(0, len(order) - 1, min(GOALS_SHOWN, len(order)))).astype(int)
    return [int(order[p]) for p in dict.fromkeys(picks.tolist())]


def _has_behavior(heldout: Episodes) -> bool:
    return BEHAVIOR_COLUMN in heldout.schema.extra_columns and heldout.schema.has_task_id


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


TRAJECTORIES: dict[str, Callable[..., dict[str, Any]]] = {"point_robot": point_robot_trajectories}
"""Generator name -> the function that rolls out its pictures' episodes."""
