"""An ``evaluation.env`` factory whose rollouts never end: the point robot's environment that,
at its first step, prints ``STALLING_LINE`` and then waits, so that a test finds a run inside
its evaluation stage for as long as it likes."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from pipeline.synthetic.point_robot_env import point_robot_env

STALLING_LINE = "stalling-env: the first rollout step waits for good"


class _Stalling(gym.Wrapper):
    def step(self, action: Any) -> Any:
        print(STALLING_LINE, flush=True)
        while True:  # short sleeps: a signal's handler runs between them, whichever thread got it
            time.sleep(0.1)


def stalling_point_robot(task_id: str, params: Mapping[str, Any], **kwargs: Any) -> gym.Env:
    """``pipeline.synthetic.point_robot_env.point_robot_env`` that stalls at its first step."""
    return _Stalling(point_robot_env(task_id, params, **kwargs))
