"""Meta-World ML1 goal tasks as the held-out environments of ``offmeta run``:
``evaluation.env: pipeline.benchmarks.metaworld_env:ml1_env``.

``ml1_env(task_id, params)`` is called as every ``evaluation.env`` factory is
(docs/evaluation.md), with ``params`` the task's ``dataset.json`` entry written by
``metaworld_record`` (``env_name``, ``rand_vec``). The environment is Meta-World's, frozen on
that goal with the goal hidden; observations are float32 as in the recorded data. ``info``
adds ``expert_action`` (the scripted expert given the true goal: the evaluation's
``expert``), ``position`` (the gripper's x, y) and ``goal`` (the goal's x, y) for the rollout
picture; Meta-World's own ``success`` is kept.

Imports metaworld when an environment is made (it is not an offmeta dependency).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.benchmarks.metaworld_tasks import (
    EPISODE_STEPS,
    expert_action,
    expert_for,
    make_task_env,
)


class ML1GoalEnv(gym.Wrapper):
    """One ML1 task: Meta-World's environment frozen on a goal, float32 observations, and
    the expert's next action, the gripper and the goal in ``info``."""

    def __init__(self, env_name: str, rand_vec: Any, max_steps: int = EPISODE_STEPS) -> None:
        super().__init__(make_task_env(env_name, rand_vec, max_steps))
        self._expert = expert_for(env_name)
        space = self.env.observation_space
        self.observation_space = gym.spaces.Box(
            space.low.astype(np.float32), space.high.astype(np.float32), dtype=np.float32
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return obs.astype(np.float32), self._info(obs, info)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(np.asarray(action))
        return obs.astype(np.float32), float(reward), terminated, truncated, self._info(obs, info)

    def _info(self, obs: np.ndarray, info: dict[str, Any]) -> dict[str, Any]:
        goal = np.asarray(self.env.unwrapped._target_pos, dtype=np.float64)
        return {
            **info,
            "expert_action": expert_action(self._expert, obs, goal),
            "position": np.asarray(obs[:2], dtype=np.float64),
            "goal": goal[:2].copy(),
        }


def ml1_env(task_id: str, params: Mapping[str, Any], **kwargs: Any) -> ML1GoalEnv:
    """The env factory of ``metaworld_ml1`` datasets; ``kwargs`` (``evaluation.env_kwargs``,
    e.g. ``max_steps``) go to ``ML1GoalEnv``."""
    missing = [key for key in ("env_name", "rand_vec") if key not in params]
    if missing:
        raise ValueError(
            f"Meta-World task {task_id!r}: params have no {', '.join(map(repr, missing))}; "
            "expected the task's entry in dataset.json 'tasks' as "
            "pipeline.benchmarks.metaworld_record writes it"
        )
    return ML1GoalEnv(params["env_name"], params["rand_vec"], **kwargs)
