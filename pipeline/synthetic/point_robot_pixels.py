"""The point robot seen through a camera: the same goal-reaching tasks as ``point_robot``,
observed as small uint8 images of the robot (a Gaussian blob) instead of its position.

The goal is drawn nowhere, so, as with positions, a policy can tell the task only from
that task's transitions. The camera looks at the square ``VIEW`` (the start, every goal on
the upper unit half-circle and some margin); a robot outside it leaves the image empty.
``render`` is the one camera: the dataset generator and the Gymnasium environment of
``pipeline.synthetic.point_robot_pixels_env`` both draw with it, so a policy sees in
evaluation exactly the pixels it was trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from pipeline.contract.dataset_json import Space
from pipeline.contract.schema import ObservationLayout
from pipeline.synthetic.point_robot import MAX_ACTION
from pipeline.synthetic.point_robot_episodes import PointRobotTasks

VIEW = (-1.5, 1.5, -1.0, 2.0)
"""``(x_min, x_max, y_min, y_max)`` of the plane the image covers; y grows upwards."""


def render(
    positions: np.ndarray,
    *,
    image_size: int = 32,
    blob_sigma: float = 1.0,
    layout: ObservationLayout = "CHW",
) -> np.ndarray:
    """One grey image per position: ``[N, 1, S, S]`` (``CHW``) or ``[N, S, S, 1]`` (``HWC``)
    uint8, the robot a Gaussian blob of ``blob_sigma`` pixels peaking at 255 at its
    position (sub-pixel positions shift the blob's intensities, so they stay visible)."""
    positions = np.asarray(positions, dtype=np.float64).reshape(-1, 2)
    x_min, x_max, y_min, y_max = VIEW
    centres = (np.arange(image_size) + 0.5) / image_size
    xs = x_min + centres * (x_max - x_min)
    ys = y_max - centres * (y_max - y_min)  # row 0 is the top of the picture
    pixel = (x_max - x_min) / image_size
    scale = 2.0 * (blob_sigma * pixel) ** 2
    across = np.exp(-((xs[None, :] - positions[:, :1]) ** 2) / scale)
    down = np.exp(-((ys[None, :] - positions[:, 1:]) ** 2) / scale)
    # The blob is separable: an outer product of its row and column profiles.
    blob = np.rint(255.0 * down[:, :, None] * across[:, None, :]).astype(np.uint8)
    # A fresh array, not a view with a new axis: pyarrow reads the axis order of a tensor
    # from its strides, and a view's stride on a length-1 axis would reorder the shape.
    shape = (1, image_size, image_size) if layout == "CHW" else (image_size, image_size, 1)
    images = np.empty((len(positions), *shape), dtype=np.uint8)
    images.reshape(len(positions), image_size, image_size)[:] = blob
    return images


@dataclass(frozen=True)
class PointRobotPixelTasks:
    """Generator arguments for ``point_robot_pixels`` (recorded in ``dataset.json``): the
    noisy expert of ``point_robot``, filmed."""

    episodes_per_task: int = 4
    """Expert episodes per goal."""
    noise_std: float = 0.03
    """Standard deviation of the Gaussian noise on each expert action component."""
    random_fraction: float = 0.1
    """Fraction of the expert's actions replaced by uniform random ones."""
    image_size: int = 32
    """Height and width of the images, in pixels."""
    blob_sigma: float = 1.0
    """Standard deviation of the robot's blob, in pixels."""
    layout: Literal["CHW", "HWC"] = "CHW"
    """Axis order of the stored images (``dataset.json`` ``observation_layout``)."""
    new_obs: bool = True
    """Record ``new_obs``; without it (the committed sample) the images take half the bytes,
    and behaviour cloning never reads them."""

    name: ClassVar[str] = "point_robot_pixels"
    default_tasks: ClassVar[int] = 200
    default_heldout_tasks: ClassVar[int] = 50

    def __post_init__(self) -> None:
        if self.image_size < 4:
            raise ValueError(f"image_size must be at least 4 pixels, got {self.image_size}")
        if not self.blob_sigma > 0:
            raise ValueError(f"blob_sigma must be > 0 pixels, got {self.blob_sigma}")
        if self.layout not in ("CHW", "HWC"):
            raise ValueError(f"layout must be CHW or HWC, got {self.layout!r}")
        self._positions()  # its own checks of the expert's arguments

    @property
    def observation_layout(self) -> ObservationLayout:
        return self.layout

    @property
    def description(self) -> str:
        size = self.image_size
        return (
            f"Point robot reaching an unobserved goal on the upper unit half-circle, seen as "
            f"1x{size}x{size} grey images of the robot: noisy expert"
            + ("" if self.new_obs else " (no new_obs)")
        )

    @property
    def rows_per_task(self) -> int:
        return self._positions().rows_per_task

    def image_shape(self) -> tuple[int, int, int]:
        size = self.image_size
        return (1, size, size) if self.layout == "CHW" else (size, size, 1)

    def spaces(self) -> tuple[Space, Space]:
        observation = Space(kind="box", shape=self.image_shape(), low=0, high=255)
        action = Space(kind="box", shape=(2,), low=-MAX_ACTION, high=MAX_ACTION)
        return observation, action

    def sample_tasks(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]:
        return self._positions().sample_tasks(rng, n)

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]:
        columns = self._positions().episodes(rng, tasks, task_ids, first_task)
        if not self.new_obs:
            del columns["new_obs"]
        for name in ("obs", "new_obs")[: 1 + self.new_obs]:
            columns[name] = render(
                columns[name],
                image_size=self.image_size,
                blob_sigma=self.blob_sigma,
                layout=self.layout,
            )
        return columns

    def _positions(self) -> PointRobotTasks:
        """The position dataset these images film (same episodes for the same seed)."""
        return PointRobotTasks(
            episodes_per_task=self.episodes_per_task,
            noise_std=self.noise_std,
            random_fraction=self.random_fraction,
        )
