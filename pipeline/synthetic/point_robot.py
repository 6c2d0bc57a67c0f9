"""A point robot on a plane that must reach a goal it cannot see.

Each task is a goal on the upper half of the unit circle. The observation is only the
robot's position, so a policy can tell which task it is in from that task's data alone
(the few-shot adaptation problem). Everything is vectorised over a batch of episodes:
row ``i`` of every array belongs to ``goals[i]``.

The environment serves two masters: the ``point_robot`` dataset generator (expert
episodes) and evaluation rollouts of trained policies (``rollout_returns``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

MAX_ACTION = 0.1
"""Each action component is clipped to ``[-MAX_ACTION, MAX_ACTION]``."""
EPISODE_STEPS = 20
START_NOISE = 0.05
"""Episodes start uniformly in ``[-START_NOISE, START_NOISE]^2`` around the origin."""

Policy = Callable[[np.ndarray], np.ndarray]
"""``obs [N, 2] float32 -> actions [N, 2]``; row ``i`` is the episode of ``goals[i]``."""


def sample_goals(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` goals on the upper half of the unit circle, ``[n, 2]`` float64."""
    angle = rng.uniform(0.0, np.pi, size=n)
    return np.stack([np.cos(angle), np.sin(angle)], axis=-1)


@dataclass
class PointRobotEnv:
    """A batch of point-robot episodes, one per row of ``goals``."""

    goals: np.ndarray
    """``[N, 2]`` goal positions; never part of the observation."""
    max_steps: int = EPISODE_STEPS
    start_noise: float = START_NOISE
    _position: np.ndarray = field(init=False, repr=False)
    _steps: int = field(init=False, default=0, repr=False)

    def reset(self, rng: np.random.Generator) -> np.ndarray:
        """Start every episode near the origin; returns ``obs [N, 2]`` float32."""
        noise = self.start_noise
        self._position = rng.uniform(-noise, noise, size=self.goals.shape)
        self._steps = 0
        return self._position.astype(np.float32)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Move by the clipped actions; returns ``(obs, rewards, terminateds, truncateds)``.

        The reward is minus the distance to the goal after the move. Episodes never
        terminate (the goal is not absorbing); they are truncated after ``max_steps``.
        """
        if self._steps >= self.max_steps:
            raise RuntimeError(f"episodes ended after {self.max_steps} steps; call reset()")
        moves = np.clip(np.asarray(actions, dtype=np.float64), -MAX_ACTION, MAX_ACTION)
        if moves.shape != self.goals.shape:
            raise ValueError(f"actions have shape {moves.shape}; expected {self.goals.shape}")
        self._position = self._position + moves
        self._steps += 1
        rewards = -np.linalg.norm(self._position - self.goals, axis=-1)
        n = len(self.goals)
        terminateds = np.zeros(n, dtype=bool)
        truncateds = np.full(n, self._steps == self.max_steps)
        return (
            self._position.astype(np.float32),
            rewards.astype(np.float32),
            terminateds,
            truncateds,
        )


def expert_actions(
    obs: np.ndarray,
    goals: np.ndarray,
    rng: np.random.Generator,
    *,
    noise_std: float,
    random_fraction: float,
) -> np.ndarray:
    """The behaviour policy: ``expert_step``, plus Gaussian noise, a ``random_fraction`` of
    the actions replaced by uniform random ones, clipped. Returns ``[N, 2]`` float32."""
    step = expert_step(obs, goals)
    actions = step + rng.normal(0.0, noise_std, size=step.shape)
    random = rng.uniform(-MAX_ACTION, MAX_ACTION, size=step.shape)
    replace = rng.random(len(step)) < random_fraction
    actions = np.where(replace[:, None], random, actions)
    return np.clip(actions, -MAX_ACTION, MAX_ACTION).astype(np.float32)


def expert_step(obs: np.ndarray, goals: np.ndarray) -> np.ndarray:
    """The noise-free expert's move, ``[N, 2]`` float64: head for the goal at full speed,
    or exactly onto it when closer than one step."""
    to_goal = goals - obs
    distance = np.linalg.norm(to_goal, axis=-1, keepdims=True)
    return to_goal * np.minimum(1.0, MAX_ACTION / np.maximum(distance, 1e-12))


def rollout_returns(
    policy: Policy,
    goals: np.ndarray,
    *,
    seed: int = 0,
    max_steps: int = EPISODE_STEPS,
) -> np.ndarray:
    """Run one episode per goal with ``policy`` and return each episode's undiscounted
    return, ``[N]`` float64. Row ``i`` of the observations handed to ``policy`` is always
    the episode of ``goals[i]``, so a per-task adapted policy can act on all tasks in one
    call. Repeat rows of ``goals`` for more episodes per task; ``.mean()`` for one number.
    """
    return rollout_paths(policy, goals, seed=seed, max_steps=max_steps).returns


class RolloutPaths(NamedTuple):
    """Episodes of a policy, one per goal."""

    positions: np.ndarray
    """``[N, max_steps + 1, 2]`` float32: the start, then the position after each step."""
    returns: np.ndarray
    """``[N]`` float64 undiscounted returns."""


def rollout_paths(
    policy: Policy,
    goals: np.ndarray,
    *,
    seed: int = 0,
    max_steps: int = EPISODE_STEPS,
) -> RolloutPaths:
    """``rollout_returns`` that also keeps every position the robot visited: the same
    episodes (same starts for the same ``seed`` and number of goals), for pictures."""
    goals = np.asarray(goals, dtype=np.float64)
    env = PointRobotEnv(goals, max_steps=max_steps)
    obs = env.reset(np.random.default_rng(seed))
    positions = [obs]
    returns = np.zeros(len(goals))
    for _ in range(max_steps):
        obs, rewards, _, _ = env.step(policy(obs))
        positions.append(obs)
        returns += rewards
    return RolloutPaths(np.stack(positions, axis=1), returns)
