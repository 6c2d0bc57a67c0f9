"""Offline goal-reaching episodes of the point robot (see ``point_robot``).

Each task is a goal; its episodes are played by a noisy expert: full speed towards the
goal plus Gaussian noise (``noise_std``), with a ``random_fraction`` of actions replaced by
uniform random ones, all clipped to ``[-0.1, 0.1]``. ``new_obs`` is recorded, the last step
of every episode is truncated, ``eps_id`` is an int64 counter unique within the split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pipeline.metadata import Space
from pipeline.synthetic.point_robot import (
    EPISODE_STEPS,
    MAX_ACTION,
    PointRobotEnv,
    expert_actions,
    sample_goals,
)


@dataclass(frozen=True)
class PointRobotTasks:
    """Generator arguments for ``point_robot`` (its fields are recorded in ``dataset.json``)."""

    episodes_per_task: int = 5
    """Expert episodes per goal."""
    noise_std: float = 0.03
    """Standard deviation of the Gaussian noise on each expert action component."""
    random_fraction: float = 0.1
    """Fraction of actions replaced by uniform random ones."""

    name: ClassVar[str] = "point_robot"
    description: ClassVar[str] = (
        "Point robot reaching an unobserved goal on the upper unit half-circle: noisy expert"
    )
    default_tasks: ClassVar[int] = 1_000
    default_heldout_tasks: ClassVar[int] = 100

    def __post_init__(self) -> None:
        if self.episodes_per_task < 1:
            raise ValueError(f"episodes_per_task must be at least 1, got {self.episodes_per_task}")
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {self.noise_std}")
        if not 0.0 <= self.random_fraction <= 1.0:
            raise ValueError(f"random_fraction must be in [0, 1], got {self.random_fraction}")

    @property
    def rows_per_task(self) -> int:
        return self.episodes_per_task * EPISODE_STEPS

    def spaces(self) -> tuple[Space, Space]:
        observation = Space(kind="box", shape=(2,))
        action = Space(kind="box", shape=(2,), low=-MAX_ACTION, high=MAX_ACTION)
        return observation, action

    def sample_tasks(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        # Rounded before use, so dataset.json describes the data exactly in few digits.
        goals = np.round(sample_goals(rng, n), 6)
        return [{"goal": [float(x), float(y)]} for x, y in goals]

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]:
        goals = np.repeat(np.array([t["goal"] for t in tasks]), self.episodes_per_task, axis=0)
        env = PointRobotEnv(goals)
        obs = env.reset(rng)
        steps = []
        for _ in range(EPISODE_STEPS):
            actions = expert_actions(
                obs, goals, rng, noise_std=self.noise_std, random_fraction=self.random_fraction
            )
            new_obs, rewards, terminateds, truncateds = env.step(actions)
            steps.append((obs, actions, rewards, terminateds, truncateds, new_obs))
            obs = new_obs
        # [T, E, ...] -> [E, T, ...] -> rows, so each episode's steps are contiguous.
        columns = [
            np.stack(c, axis=1).reshape(-1, *c[0].shape[1:]) for c in zip(*steps, strict=True)
        ]
        obs_rows, actions_rows, rewards_rows, term_rows, trunc_rows, new_obs_rows = columns
        n_episodes, first_episode = len(goals), first_task * self.episodes_per_task
        return {
            "eps_id": np.repeat(
                np.arange(first_episode, first_episode + n_episodes), EPISODE_STEPS
            ),
            "t": np.tile(np.arange(EPISODE_STEPS, dtype=np.int32), n_episodes),
            "obs": obs_rows,
            "actions": actions_rows,
            "rewards": rewards_rows,
            "terminateds": term_rows,
            "truncateds": trunc_rows,
            "new_obs": new_obs_rows,
        }
