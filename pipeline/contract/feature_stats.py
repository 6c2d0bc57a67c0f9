"""Per-feature mean and standard deviation of a column, accumulated row group by row group.

``data.normalize`` standardises columns with statistics of the training data. They are
gathered by the value checks' own pass (``pipeline.contract.value_checks``): each row group
read gives its count, mean and sum of squared deviations per feature (float64), merged into
the running ones with Chan et al.'s pairwise update, so memory holds one row group and the
result does not depend on how the rows fall into row groups beyond rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pipeline.contract.returns_to_go import discounted_returns

MIN_STD = 1e-6
"""A feature whose standard deviation is below this (a constant) is divided by 1 instead."""


@dataclass(frozen=True)
class FeatureStats:
    """Mean and standard deviation of each feature of one column."""

    count: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    """Population standard deviation; 1.0 where it is below ``MIN_STD``."""

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "mean": list(self.mean), "std": list(self.std)}


@dataclass
class StatsAccumulator:
    """Running count, mean and squared deviations of ``[rows, width]`` values."""

    count: int = 0
    mean: np.ndarray = field(default_factory=lambda: np.zeros(0))
    m2: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def add(self, values: np.ndarray) -> None:
        """Merge ``values`` (``[rows, width]``) into the running statistics."""
        rows = len(values)
        if not rows:
            return
        values = values.astype(np.float64, copy=False)
        mean = values.mean(axis=0)
        m2 = np.square(values - mean).sum(axis=0)
        if not self.count:
            self.count, self.mean, self.m2 = rows, mean, m2
            return
        total = self.count + rows
        delta = mean - self.mean
        self.mean = self.mean + delta * (rows / total)
        self.m2 = self.m2 + m2 + np.square(delta) * (self.count * rows / total)
        self.count = total

    def result(self) -> FeatureStats:
        std = np.sqrt(self.m2 / max(self.count, 1))
        std = np.where(std < MIN_STD, 1.0, std)
        return FeatureStats(self.count, tuple(self.mean.tolist()), tuple(std.tolist()))


@dataclass
class ReturnsAccumulator:
    """Statistics of the discounted return-to-go (``pipeline.reads.returns``) of the rows
    added, episode by episode.

    A row's return needs the rest of its episode, so rows wait, per episode, until the
    episode is whole: its first step (``t`` 0), its end flag and every step between seen.
    Datasets written sorted (importers, ``offmeta data compact``) so hold one episode at a
    time; rows in another order wait until their episode is whole, and ``result`` counts
    what is still waiting (partial episodes, row groups left out by ``sample``) as recorded.
    """

    gamma: float
    stats: StatsAccumulator = field(default_factory=StatsAccumulator)
    waiting: dict[object, list[tuple[np.ndarray, np.ndarray, bool]]] = field(default_factory=dict)

    def add(
        self, episodes: np.ndarray, steps: np.ndarray, rewards: np.ndarray, ends: np.ndarray
    ) -> None:
        """Rows given by their episode key, step, reward and end flag (any order)."""
        if not len(episodes):
            return
        keys, inverse = np.unique(episodes, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(len(keys) + 1))
        for index, key in enumerate(keys.tolist()):
            rows = order[bounds[index] : bounds[index + 1]]
            parts = self.waiting.setdefault(key, [])
            parts.append((steps[rows], rewards[rows], bool(ends[rows].any())))
            if self._whole(parts):
                self._count(self.waiting.pop(key))

    def result(self) -> FeatureStats:
        for parts in self.waiting.values():
            self._count(parts)
        self.waiting.clear()
        return self.stats.result()

    @staticmethod
    def _whole(parts: list[tuple[np.ndarray, np.ndarray, bool]]) -> bool:
        if not any(ended for _, _, ended in parts):
            return False
        rows = sum(len(steps) for steps, _, _ in parts)
        first = min(int(steps.min()) for steps, _, _ in parts)
        last = max(int(steps.max()) for steps, _, _ in parts)
        return first == 0 and rows == last + 1

    def _count(self, parts: list[tuple[np.ndarray, np.ndarray, bool]]) -> None:
        steps = np.concatenate([s for s, _, _ in parts])
        rewards = np.concatenate([r for _, r, _ in parts])[np.argsort(steps, kind="stable")]
        returns = discounted_returns(rewards, np.zeros(1, np.int64), self.gamma)
        self.stats.add(returns.astype(np.float32)[:, None])
