"""A Gymnasium environment defined outside the package, and a task family of its data, for
the tests of ``evaluation.env``: a walker on the integer line that must reach a target it
cannot see.

Actions are discrete (0: left, 1: stay, 2: right); the observation is the position scaled
by ``SCALE``; the reward is minus the distance to the target after the move; ``info["success"]``
is true on the target. Episodes never terminate and are truncated after ``max_steps``. The
task's parameter is ``{"target": int}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from pipeline.contract.dataset_json import Space

SCALE = 0.25
TARGETS = (-3, -2, 2, 3)
STEPS = 8


class LineEnv(gym.Env[np.ndarray, int]):
    """One walker, one target."""

    def __init__(self, target: int, max_steps: int = STEPS) -> None:
        self.target = int(target)
        self.max_steps = max_steps
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.position = int(self.np_random.integers(-1, 2))
        self.steps = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.position += int(action) - 1
        self.steps += 1
        reward = -abs(self.position - self.target)
        info = {"success": self.position == self.target}
        return self._obs(), float(reward), False, self.steps >= self.max_steps, info

    def _obs(self) -> np.ndarray:
        return np.array([self.position * SCALE], dtype=np.float32)


def line_env(task_id: str, params: Mapping[str, Any], **kwargs: Any) -> LineEnv:
    """The env factory ``evaluation.env`` names: ``tests.helpers.line_world:line_env``."""
    return LineEnv(params["target"], **kwargs)


def params_only(task_id: str, params: Mapping[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A factory that returns no environment (a refusal test's)."""
    return dict(params)


NOT_CALLABLE = 3
"""An attribute ``evaluation.env`` may name that is not callable (a refusal test's)."""


@dataclass(frozen=True)
class LineWorldTasks:
    """Expert episodes in ``LineEnv`` (a ``pipeline.synthetic.generate`` task family): head
    for the target, then stay; a share of random actions."""

    episodes_per_task: int = 2
    random_fraction: float = 0.2

    name: ClassVar[str] = "line_world"
    description: ClassVar[str] = "a walker on the integer line reaching an unobserved target"
    default_tasks: ClassVar[int] = 12
    default_heldout_tasks: ClassVar[int] = 4

    @property
    def rows_per_task(self) -> int:
        return self.episodes_per_task * STEPS

    def spaces(self) -> tuple[Space, Space]:
        return Space(kind="box", shape=(1,)), Space(kind="discrete", n=3)

    def sample_tasks(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        return [{"target": int(t)} for t in rng.choice(TARGETS, size=n)]

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]:
        columns: dict[str, list[Any]] = {
            name: []
            for name in ("eps_id", "t", "obs", "actions", "rewards", "terminateds", "truncateds")
        }
        for task, task_id in zip(tasks, task_ids, strict=True):
            for episode in range(self.episodes_per_task):
                env = LineEnv(task["target"])
                obs, _ = env.reset(seed=int(rng.integers(2**31)))
                for t in range(STEPS):
                    action = int(np.sign(env.target - env.position)) + 1
                    if rng.random() < self.random_fraction:
                        action = int(rng.integers(3))
                    new_obs, reward, terminated, truncated, _ = env.step(action)
                    for name, value in (
                        ("eps_id", f"{task_id}-{episode}"),
                        ("t", t),
                        ("obs", obs),
                        ("actions", action),
                        ("rewards", reward),
                        ("terminateds", terminated),
                        ("truncateds", truncated),
                    ):
                        columns[name].append(value)
                    obs = new_obs
        return {
            "eps_id": np.array(columns["eps_id"], dtype=object),
            "t": np.array(columns["t"], dtype=np.int32),
            "obs": np.stack(columns["obs"]).astype(np.float32),
            "actions": np.array(columns["actions"], dtype=np.int64),
            "rewards": np.array(columns["rewards"], dtype=np.float32),
            "terminateds": np.array(columns["terminateds"], dtype=bool),
            "truncateds": np.array(columns["truncateds"], dtype=bool),
        }
