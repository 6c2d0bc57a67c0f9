"""Exploration episodes recorded as transitions, and the support sets cut from them.

``Recorder`` wraps one environment and keeps every step of the one episode it runs:
``obs, actions, rewards, new_obs, terminateds, truncateds``; ``returns`` /
``returns_truncated`` are derived per recorded episode with ``data.gamma`` (as at ingest).

``Slice`` is some steps of a recorded episode (``evaluation.context_explore: library``
keeps one window of an episode). ``support_windows`` turns each task's recorded episodes
(or slices) into one support set. Vmap needs one support size for every task: each episode
gives its first L steps, L = ``window`` (``tasks.support_window``) when every episode is at
least that long, otherwise the shortest episode's length, so K = episodes x L
(fixed-horizon environments give whole episodes).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
import torch

from pipeline.contract.schema import ObservationLayout
from pipeline.reads.returns import discounted_returns
from pipeline.streams.collate import Batch, finalize, gather

RECORDED = ("obs", "actions", "rewards", "new_obs", "terminateds", "truncateds")
"""The columns an exploration step records."""
DERIVED = ("returns", "returns_truncated")


class Recorder(gym.Wrapper):
    """Records every transition of the episode it runs."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps: dict[str, list[Any]] = {name: [] for name in RECORDED}
        self._obs: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._obs, info = self.env.reset(**kwargs)
        return self._obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        new_obs, reward, terminated, truncated, info = self.env.step(action)
        for name, value in zip(
            RECORDED, (self._obs, action, reward, new_obs, terminated, truncated), strict=True
        ):
            self.steps[name].append(value)
        self._obs = new_obs
        return new_obs, reward, terminated, truncated, info

    @property
    def length(self) -> int:
        """Steps recorded."""
        return len(self.steps["rewards"])


class Recorded(Protocol):
    """Recorded steps: a ``Recorder``'s whole episode, or a ``Slice`` of one."""

    @property
    def steps(self) -> dict[str, list[Any]]: ...

    @property
    def length(self) -> int: ...


class Slice:
    """Steps ``[start, stop)`` of a recorded episode (fewer where it ended sooner)."""

    def __init__(self, recorder: Recorder, start: int, stop: int) -> None:
        self.steps = {name: values[start:stop] for name, values in recorder.steps.items()}

    @property
    def length(self) -> int:
        return len(self.steps["rewards"])


class Windows(NamedTuple):
    """Support sets cut from recorded episodes."""

    support: Batch
    """``{module: {column: [tasks, episodes x steps, ...]}}`` on the device, as finalize
    gives."""
    steps: int
    """Steps each episode gives (L)."""


def support_windows(
    episodes: Sequence[Sequence[Recorded]],
    *,
    module: str,
    window: int | None,
    gamma: float,
    like: Mapping[str, np.ndarray],
    device: torch.device | str,
    obs_layout: ObservationLayout | None = None,
) -> Windows:
    """Each task's recorded ``episodes`` (the same number per task) as one support set of
    ``module``'s rows (module docstring), with the columns of ``like`` that are recorded or
    derived, in their dtypes, on ``device``."""
    recorders = [recorder for task in episodes for recorder in task]
    lengths = np.array([recorder.length for recorder in recorders])
    if lengths.min() == 0:
        raise ValueError(
            "evaluation.context online: an exploration episode ended before its first step; "
            "expected every episode to take at least one step"
        )
    shortest = int(lengths.min())
    steps = window if window is not None and shortest >= window else shortest
    columns = _columns(recorders, lengths, gamma)
    starts = np.cumsum([0, *lengths[:-1]])
    index = (starts[:, None] + np.arange(steps)).reshape(len(episodes), -1)
    wanted = [name for name in like if name in RECORDED or name in DERIVED]
    batch = {
        name: gather(np.asarray(columns[name], dtype=like[name].dtype), index) for name in wanted
    }
    return Windows(finalize({module: batch}, device, obs_layout=obs_layout), steps)


def _columns(
    recorders: Sequence[Recorded], lengths: np.ndarray, gamma: float
) -> dict[str, np.ndarray]:
    """Every recorded step of ``recorders`` (episode after episode), and the derived
    columns."""
    columns = {
        name: np.asarray([value for r in recorders for value in r.steps[name]]) for name in RECORDED
    }
    starts = np.cumsum(np.concatenate(([0], lengths[:-1])))
    columns["returns"] = discounted_returns(columns["rewards"].astype(np.float64), starts, gamma)
    terminated = columns["terminateds"].astype(bool)[starts + lengths - 1]
    columns["returns_truncated"] = np.repeat(~terminated, lengths)
    return columns
