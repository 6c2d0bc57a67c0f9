"""The pixel point robot as a Gymnasium environment, one held-out task per instance.

``make_env(task_id, params, **env_kwargs)`` is an environment factory in the shape
``evaluation.env`` calls (``params``: the task's ``dataset.json`` entry, ``{"goal": [x, y]}``);
``env_kwargs`` are the generator's camera settings (``image_size``, ``blob_sigma``,
``layout``), which must match the dataset's. The dynamics are ``point_robot``'s and the
camera is ``point_robot_pixels.render``, so rollouts see the pixels the data holds.
Needs gymnasium (the ``train`` extra).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np

from pipeline.synthetic.point_robot import EPISODE_STEPS, MAX_ACTION, PointRobotEnv
from pipeline.synthetic.point_robot_pixels import PointRobotPixelTasks, render

SUCCESS_RADIUS = 0.1
"""An episode succeeds when the robot ends within this distance of the goal."""


class PointRobotPixelEnv(gymnasium.Env[np.ndarray, np.ndarray]):
    """Reach the unseen goal of one task; observations are ``render``'s images.

    Reward: minus the distance to the goal after each move; episodes are truncated after
    ``max_steps`` and never terminate. ``info`` carries ``position`` (for 2-D path pictures)
    and, at the last step, ``is_success``.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's own attribute)

    def __init__(
        self,
        goal: tuple[float, float],
        *,
        image_size: int = 32,
        blob_sigma: float = 1.0,
        layout: str = "CHW",
        max_steps: int = EPISODE_STEPS,
    ) -> None:
        self._camera = PointRobotPixelTasks(
            image_size=image_size,
            blob_sigma=blob_sigma,
            layout=layout,  # type: ignore[arg-type]
        )
        self._goal = np.asarray(goal, dtype=np.float64).reshape(1, 2)
        self._robot = PointRobotEnv(self._goal, max_steps=max_steps)
        self.observation_space = gymnasium.spaces.Box(
            0, 255, self._camera.image_shape(), dtype=np.uint8
        )
        self.action_space = gymnasium.spaces.Box(-MAX_ACTION, MAX_ACTION, (2,), dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        position = self._robot.reset(self.np_random)
        return self._observe(position), {"position": position[0].tolist()}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        position, rewards, terminateds, truncateds = self._robot.step(
            np.asarray(action, dtype=np.float64).reshape(1, 2)
        )
        info: dict[str, Any] = {"position": position[0].tolist()}
        if truncateds[0]:
            distance = float(np.linalg.norm(position[0] - self._goal[0]))
            info["is_success"] = distance <= SUCCESS_RADIUS
        return (
            self._observe(position),
            float(rewards[0]),
            bool(terminateds[0]),
            bool(truncateds[0]),
            info,
        )

    def _observe(self, position: np.ndarray) -> np.ndarray:
        camera = self._camera
        return render(
            position,
            image_size=camera.image_size,
            blob_sigma=camera.blob_sigma,
            layout=camera.layout,
        )[0]


def make_env(task_id: str, params: Mapping[str, Any], **env_kwargs: Any) -> PointRobotPixelEnv:
    """The environment of held-out task ``task_id`` from its ``dataset.json`` parameters."""
    if "goal" not in params:
        raise ValueError(
            f"task {task_id!r}: parameters {dict(params)} have no 'goal'; expected the "
            "point_robot_pixels task entry of dataset.json, {'goal': [x, y]}"
        )
    x, y = params["goal"]
    return PointRobotPixelEnv((float(x), float(y)), **env_kwargs)
