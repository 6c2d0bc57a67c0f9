"""The sinusoid regression tasks of the MAML paper, as an episode dataset.

A task is ``y = amplitude * sin(x - phase)`` with amplitude ~ U[0.1, 5.0] and phase ~
U[0, pi]; its points have x ~ U[-5, 5]. In the episode contract ``obs`` is x (shape
``(1,)``) and ``actions`` is the target y (shape ``(1,)``, float), rewards are 0. Each task
is one episode of ``points`` rows with ``eps_id`` equal to the task id; ``t`` is the point's
index, nothing terminates, and the last point is marked truncated (the sample ends, not
the task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from pipeline.contract.dataset_json import Space

AMPLITUDE = (0.1, 5.0)
PHASE = (0.0, np.pi)
X_RANGE = (-5.0, 5.0)


@dataclass(frozen=True)
class SinusoidTasks:
    """Generator arguments for ``sinusoid`` (its fields are recorded in ``dataset.json``)."""

    points: int = 20
    """Points (rows) per task: K support + Q query must fit in it."""

    name: ClassVar[str] = "sinusoid"
    description: ClassVar[str] = "MAML sinusoid regression: obs = x, actions = A*sin(x - phase)"
    default_tasks: ClassVar[int] = 10_000
    default_heldout_tasks: ClassVar[int] = 600

    def __post_init__(self) -> None:
        if self.points < 1:
            raise ValueError(f"points must be at least 1, got {self.points}")

    @property
    def rows_per_task(self) -> int:
        return self.points

    def spaces(self) -> tuple[Space, Space]:
        observation = Space(kind="box", shape=(1,), low=X_RANGE[0], high=X_RANGE[1])
        action = Space(kind="box", shape=(1,), low=-AMPLITUDE[1], high=AMPLITUDE[1])
        return observation, action

    def sample_tasks(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        # Rounded before use, so dataset.json describes the data exactly in few digits.
        amplitude = np.round(rng.uniform(*AMPLITUDE, size=n), 6)
        phase = np.round(rng.uniform(*PHASE, size=n), 6)
        return [
            {"amplitude": float(a), "phase": float(p)}
            for a, p in zip(amplitude, phase, strict=True)
        ]

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]:
        n, k = len(tasks), self.points
        amplitude = np.array([t["amplitude"] for t in tasks])[:, None]
        phase = np.array([t["phase"] for t in tasks])[:, None]
        x = rng.uniform(*X_RANGE, size=(n, k))
        y = amplitude * np.sin(x - phase)
        last = np.zeros((n, k), dtype=bool)
        last[:, -1] = True
        return {
            "eps_id": np.repeat(np.array(task_ids, dtype=object), k),
            "t": np.tile(np.arange(k, dtype=np.int32), n),
            "obs": x.reshape(-1, 1).astype(np.float32),
            "actions": y.reshape(-1, 1).astype(np.float32),
            "rewards": np.zeros(n * k, dtype=np.float32),
            "terminateds": np.zeros(n * k, dtype=bool),
            "truncateds": last.reshape(-1),
        }
