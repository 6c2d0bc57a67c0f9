"""The point robot (``pipeline.synthetic.point_robot``) as a Gymnasium environment, one goal
per environment: the env factory held-out evaluation uses for ``point_robot`` datasets.

``point_robot_env(task_id, params)`` is called as every ``evaluation.env`` factory is
(docs/evaluation.md), with ``params`` the task's ``dataset.json`` entry (``{"goal": [x, y]}``).
The dynamics, rewards and start distribution are ``PointRobotEnv``'s, on a batch of one: an
episode started from the same draws gives the same positions and rewards as a row of the
batched environment. ``info`` carries ``position`` (for the rollout picture), ``goal`` and
``expert_action``, the noise-free expert's next action (the evaluation's ``expert``).

Imports gymnasium (the ``train`` extra), so ``pipeline.synthetic`` does not import this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.synthetic.point_robot import (
    EPISODE_STEPS,
    MAX_ACTION,
    START_NOISE,
    PointRobotEnv,
    expert_step,
)


class PointRobotGoalEnv(gym.Env[np.ndarray, np.ndarray]):
    """One point robot that must reach ``goal``; the observation is its position only."""

    def __init__(
        self,
        goal: tuple[float, float] | np.ndarray,
        *,
        max_steps: int = EPISODE_STEPS,
        start_noise: float = START_NOISE,
    ) -> None:
        self.goal = np.asarray(goal, dtype=np.float64).reshape(2)
        self._robot = PointRobotEnv(self.goal[None], max_steps=max_steps, start_noise=start_noise)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-MAX_ACTION, MAX_ACTION, shape=(2,), dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        obs = self._robot.reset(self.np_random)[0]
        return obs, self._info(obs)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, rewards, terminateds, truncateds = self._robot.step(np.asarray(action)[None])
        return (
            obs[0],
            float(rewards[0]),
            bool(terminateds[0]),
            bool(truncateds[0]),
            self._info(obs[0]),
        )

    def _info(self, obs: np.ndarray) -> dict[str, Any]:
        # As expert_actions without noise: the clip and the float32 cast.
        expert = np.clip(expert_step(obs[None], self.goal[None])[0], -MAX_ACTION, MAX_ACTION)
        return {
            "position": obs.copy(),
            "goal": self.goal.copy(),
            "expert_action": expert.astype(np.float32),
        }


def point_robot_env(task_id: str, params: Mapping[str, Any], **kwargs: Any) -> PointRobotGoalEnv:
    """The env factory of ``point_robot`` datasets: ``params["goal"]`` is the task's goal;
    ``kwargs`` (``evaluation.env_kwargs``) go to ``PointRobotGoalEnv``."""
    if "goal" not in params:
        raise ValueError(
            f"point robot task {task_id!r}: params {dict(params)} have no 'goal'; expected "
            "{'goal': [x, y]} (the task's entry in dataset.json 'tasks')"
        )
    return PointRobotGoalEnv(params["goal"], **kwargs)
