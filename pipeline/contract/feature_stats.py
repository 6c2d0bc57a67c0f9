"""Per-feature mean and standard deviation of a column, accumulated row group by row group.

``data.normalize`` standardises inputs with statistics of the training data. They are
gathered by the value checks' own pass (``pipeline.contract.value_checks``): each row group
read gives its count, mean and sum of squared deviations per feature (float64), merged into
the running ones with Chan et al.'s pairwise update, so memory holds one row group and the
result does not depend on how the rows fall into row groups beyond rounding.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

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
