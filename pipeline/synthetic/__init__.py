"""Synthetic task families, their datasets, and the point-robot environment.

``GENERATORS`` maps a generator name (as used by ``offmeta data generate NAME``) to its
task family; ``generate`` writes a family's train and held-out splits.
"""

from __future__ import annotations

from pipeline.synthetic.generate import ROW_GROUP_SIZE, ROWS_PER_FILE, TaskFamily, generate
from pipeline.synthetic.point_robot_episodes import PointRobotTasks
from pipeline.synthetic.point_robot_pixels import PointRobotPixelTasks
from pipeline.synthetic.sinusoid import SinusoidTasks

GENERATORS: dict[str, type[TaskFamily]] = {
    SinusoidTasks.name: SinusoidTasks,
    PointRobotTasks.name: PointRobotTasks,
    PointRobotPixelTasks.name: PointRobotPixelTasks,
}

__all__ = [
    "GENERATORS",
    "ROWS_PER_FILE",
    "ROW_GROUP_SIZE",
    "PointRobotPixelTasks",
    "PointRobotTasks",
    "SinusoidTasks",
    "TaskFamily",
    "generate",
]
