"""Offline goal-reaching episodes of the point robot (see ``point_robot``).

Each task is a goal; who plays its episodes is the ``behavior``:

- ``noisy`` (default): a noisy expert, full speed towards the goal plus Gaussian noise
  (``noise_std``), with a ``random_fraction`` of actions replaced by uniform random ones;
- ``expert``: the noise-free expert;
- ``mixed``: per task, ``random_share * episodes_per_task`` episodes (a whole number,
  chosen at random) of a uniform random policy, the others of the noisy expert: data where
  cloning copies bad actions. Each episode's behaviour is in the ``behavior`` column
  (``random`` | ``noisy_expert``) and, per task in episode order, in ``dataset.json``
  (``tasks[task_id]["behaviors"]``).

All actions are clipped to ``[-0.1, 0.1]``. ``new_obs`` is recorded, the last step of every
episode is truncated, ``eps_id`` is an int64 counter unique within the split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from pipeline.contract.dataset_json import Space
from pipeline.synthetic.point_robot import (
    EPISODE_STEPS,
    MAX_ACTION,
    PointRobotEnv,
    expert_actions,
    sample_goals,
)

BEHAVIOR_COLUMN = "behavior"
"""The column of ``mixed`` data that names each episode's behaviour policy (a label);
evaluation reads it to draw the recorded episodes (``flows.evaluation.trajectories``)."""


@dataclass(frozen=True)
class PointRobotTasks:
    """Generator arguments for ``point_robot`` (its fields are recorded in ``dataset.json``)."""

    episodes_per_task: int = 5
    """Expert episodes per goal."""
    noise_std: float = 0.03
    """Standard deviation of the Gaussian noise on each expert action component."""
    random_fraction: float = 0.1
    """Fraction of the noisy expert's actions replaced by uniform random ones."""
    behavior: Literal["expert", "noisy", "mixed"] = "noisy"
    """Who plays the episodes: the noise-free expert, the noisy expert, or a mix of the
    noisy expert and a uniform random policy."""
    random_share: float = 0.4
    """With ``mixed``: the share of each task's episodes played by the random policy (a
    whole number of episodes)."""

    name: ClassVar[str] = "point_robot"
    default_tasks: ClassVar[int] = 1_000
    default_heldout_tasks: ClassVar[int] = 100

    def __post_init__(self) -> None:
        if self.episodes_per_task < 1:
            raise ValueError(f"episodes_per_task must be at least 1, got {self.episodes_per_task}")
        if self.noise_std < 0:
            raise ValueError(f"noise_std must be >= 0, got {self.noise_std}")
        if not 0.0 <= self.random_fraction <= 1.0:
            raise ValueError(f"random_fraction must be in [0, 1], got {self.random_fraction}")
        if self.behavior not in _BEHAVIORS:
            raise ValueError(
                f"behavior must be one of {', '.join(_BEHAVIORS)}, got {self.behavior!r}"
            )
        if not 0.0 <= self.random_share <= 1.0:
            raise ValueError(f"random_share must be in [0, 1], got {self.random_share}")
        randoms = self.random_share * self.episodes_per_task
        if self.behavior == "mixed" and abs(randoms - round(randoms)) > 1e-9:
            raise ValueError(
                f"random_share {self.random_share} of {self.episodes_per_task} episodes per task "
                f"is {randoms:g} episodes; expected a share that gives whole episodes, e.g. "
                f"{round(randoms) / self.episodes_per_task:g}"
            )

    @property
    def description(self) -> str:
        players = {
            "expert": "noise-free expert",
            "noisy": "noisy expert",
            "mixed": f"mixed, {self.random_share:g} random policy and the rest noisy expert",
        }
        return (
            "Point robot reaching an unobserved goal on the upper unit half-circle: "
            + players[self.behavior]
        )

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
        tasks: list[dict[str, Any]] = [{"goal": [float(x), float(y)]} for x, y in goals]
        if self.behavior == "mixed":
            per_task = self.episodes_per_task
            randoms = round(self.random_share * per_task)
            # A random rank per episode: the `randoms` lowest of each task play randomly.
            ranks = rng.random((n, per_task)).argsort(axis=1).argsort(axis=1)
            for task, task_ranks in zip(tasks, ranks, strict=True):
                task["behaviors"] = [
                    _RANDOM if rank < randoms else _NOISY_EXPERT for rank in task_ranks
                ]
        return tasks

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]:
        goals = np.repeat(np.array([t["goal"] for t in tasks]), self.episodes_per_task, axis=0)
        noise_std, random_fraction = self.noise_std, self.random_fraction
        if self.behavior == "expert":
            noise_std, random_fraction = 0.0, 0.0
        behaviors = None
        if self.behavior == "mixed":
            behaviors = np.array([b for t in tasks for b in t["behaviors"]])
        env = PointRobotEnv(goals)
        obs = env.reset(rng)
        steps = []
        for _ in range(EPISODE_STEPS):
            actions = expert_actions(
                obs, goals, rng, noise_std=noise_std, random_fraction=random_fraction
            )
            if behaviors is not None:
                random = rng.uniform(-MAX_ACTION, MAX_ACTION, size=actions.shape)
                actions = np.where(
                    (behaviors == _RANDOM)[:, None], random.astype(np.float32), actions
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
        extra = {} if behaviors is None else {BEHAVIOR_COLUMN: np.repeat(behaviors, EPISODE_STEPS)}
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
            **extra,
        }


_RANDOM = "random"
_NOISY_EXPERT = "noisy_expert"
_BEHAVIORS = ("expert", "noisy", "mixed")
