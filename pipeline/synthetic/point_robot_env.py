"""The point robot (``pipeline.synthetic.point_robot``) as a Gymnasium environment, one goal
per environment: the env factory held-out evaluation uses for ``point_robot`` datasets.

``point_robot_env(task_id, params)`` is called as every ``evaluation.env`` factory is
(docs/evaluation.md), with ``params`` the task's ``dataset.json`` entry
(``{"goal": [x, y]}``). The dynamics, rewards and start distribution are ``PointRobotEnv``'s:
an episode started from the same draws gives the same positions and rewards, bit for bit, as
a row of the batched environment. A step computes them on Python floats, the operations of
the batched numpy code in the same order (that code costs ~100 us a step on a batch of one,
and ``make run``'s evaluation makes 30,000 steps). ``info`` carries ``position`` (for the
rollout picture), ``goal`` and ``expert_action``, the noise-free expert's next action (the
evaluation's ``expert``).

Imports gymnasium (the ``train`` extra), so ``pipeline.synthetic`` does not import this
module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

from pipeline.synthetic.point_robot import (
    EPISODE_STEPS,
    MAX_ACTION,
    START_NOISE,
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
        self.max_steps = max_steps
        self.start_noise = start_noise
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-MAX_ACTION, MAX_ACTION, shape=(2,), dtype=np.float32)
        self._goal = (float(self.goal[0]), float(self.goal[1]))
        self._position = (0.0, 0.0)
        self._steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        noise = self.start_noise
        # PointRobotEnv.reset's draw, for a batch of one.
        x, y = self.np_random.uniform(-noise, noise, size=(1, 2))[0]
        self._position, self._steps = (float(x), float(y)), 0
        obs = np.array(self._position, dtype=np.float32)
        return obs, self._info(obs)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._steps >= self.max_steps:
            raise RuntimeError(f"episodes ended after {self.max_steps} steps; call reset()")
        move = np.asarray(action, dtype=np.float64)
        if move.shape != (2,):
            raise ValueError(f"actions have shape {move.shape}; expected (2,)")
        # PointRobotEnv.step: clip each component, move, reward minus the distance to the goal.
        x, y = (p + _clipped(float(m)) for p, m in zip(self._position, move, strict=True))
        self._position, self._steps = (x, y), self._steps + 1
        dx, dy = x - self._goal[0], y - self._goal[1]
        reward = float(np.float32(-math.sqrt(dx * dx + dy * dy)))
        obs = np.array(self._position, dtype=np.float32)
        return obs, reward, False, self._steps == self.max_steps, self._info(obs)

    def _info(self, obs: np.ndarray) -> dict[str, Any]:
        # expert_step on the float32 observation, then expert_actions' clip and float32 cast.
        tx, ty = self._goal[0] - float(obs[0]), self._goal[1] - float(obs[1])
        ratio = MAX_ACTION / max(math.sqrt(tx * tx + ty * ty), 1e-12)
        scale = ratio if not ratio >= 1.0 else 1.0  # np.minimum(1.0, ratio): NaN stays NaN
        expert = np.array([_clipped(tx * scale), _clipped(ty * scale)], dtype=np.float32)
        return {"position": obs.copy(), "goal": self.goal.copy(), "expert_action": expert}


def _clipped(value: float) -> float:
    """``np.clip(value, -MAX_ACTION, MAX_ACTION)`` of one float (NaN stays NaN)."""
    return min(max(value, -MAX_ACTION), MAX_ACTION)


def point_robot_env(task_id: str, params: Mapping[str, Any], **kwargs: Any) -> PointRobotGoalEnv:
    """The env factory of ``point_robot`` datasets: ``params["goal"]`` is the task's goal;
    ``kwargs`` (``evaluation.env_kwargs``) go to ``PointRobotGoalEnv``."""
    if "goal" not in params:
        raise ValueError(
            f"point robot task {task_id!r}: params {dict(params)} have no 'goal'; expected "
            "{'goal': [x, y]} (the task's entry in dataset.json 'tasks')"
        )
    return PointRobotGoalEnv(params["goal"], **kwargs)
