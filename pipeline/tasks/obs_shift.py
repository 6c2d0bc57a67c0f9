"""``ObsShift``: a task translated in space, one random offset per task sample.

Some task families differ by where something is: Meta-World's reach differs by the goal's
position, and its observations hold the hand's position (now and in the previous frame).
A task sample with one offset ``d`` added to those features in every observation (support
and query, ``obs`` and ``new_obs`` alike) is the same behaviour towards a goal moved by
``d``, with the actions unchanged. Drawn afresh for every sample, the offsets fill the space
between the recorded goals, so a learner meets tasks between them and has to read the
goal from its context instead of recognising one of the few it was shown.

The offsets of an epoch come from the feed's seed and the epoch alone, one row per planned
sample (``offsets``), so the batches stay repeatable and a resumed run sees the offsets an
uninterrupted one would have.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # flows/config.py builds an ObsShift, and must not import torch
    import torch

SHIFTED_COLUMNS = ("obs", "new_obs")
"""The columns an offset is added to."""


@dataclass(frozen=True)
class ObsShift:
    """Offsets uniform in ``[-scale, scale]`` per coordinate, added to each group of
    observation features: ``groups`` are feature indices of the flattened observation, all
    of one length (the coordinates), e.g. ``((0, 1, 2), (18, 19, 20))``."""

    groups: tuple[tuple[int, ...], ...]
    scale: float

    def __post_init__(self) -> None:
        if not self.groups or not self.groups[0]:
            raise ValueError("groups must hold at least one group of feature indices")
        width = len(self.groups[0])
        if any(len(group) != width for group in self.groups):
            raise ValueError(
                f"every group must have as many features as the first ({width}), got "
                f"{[list(g) for g in self.groups]}"
            )
        flat = [i for group in self.groups for i in group]
        if any(i < 0 for i in flat) or len(set(flat)) != len(flat):
            raise ValueError(f"feature indices must be distinct and >= 0, got {flat}")
        if not self.scale > 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")

    @property
    def width(self) -> int:
        """Coordinates of one offset."""
        return len(self.groups[0])

    def describe(self) -> dict[str, object]:
        return {"groups": [list(g) for g in self.groups], "scale": self.scale}

    def check_observations(self, shape: Sequence[int], layout: str | None) -> None:
        """``ValueError`` unless observations of ``shape`` (``layout``: images' axis order,
        None for float vectors) are flat vectors holding every feature of the groups."""
        if layout is not None or len(shape) != 1:
            raise ValueError(
                f"tasks.shift_obs moves features of flat float observations; these are "
                f"{'images' if layout else 'of shape'} {list(shape)}"
            )
        largest = max(i for group in self.groups for i in group)
        if largest >= shape[0]:
            raise ValueError(
                f"tasks.shift_obs.features: feature {largest} is outside the observation's "
                f"{shape[0]} features"
            )

    def offsets(self, seed: np.random.SeedSequence, samples: int) -> np.ndarray:
        """``[samples, width]`` offsets, one row per planned sample, from ``seed`` alone."""
        rng = np.random.default_rng(seed)
        return rng.uniform(-self.scale, self.scale, size=(samples, self.width))

    def apply(self, tensors: dict[str, torch.Tensor], offsets: np.ndarray) -> None:
        """Add ``offsets`` (``[*samples, width]``, one per sample of ``tensors``' leading
        axes, whose next axis is the sample's rows) to every group, in place."""
        for column in SHIFTED_COLUMNS:
            tensor = tensors.get(column)
            if tensor is None:
                continue
            moved = tensor.new_tensor(offsets).unsqueeze(-2)
            for index in self._indexes:
                tensor[..., index] += moved

    @functools.cached_property
    def _indexes(self) -> tuple[slice | list[int], ...]:
        """Each group's index into the features, worked out once for every ``apply``."""
        return tuple(_index(group) for group in self.groups)


def _index(group: tuple[int, ...]) -> slice | list[int]:
    """A slice for consecutive increasing features (a view: added to in place, without the
    gather and scatter of a list index, which cost the feed's thread ~0.3 ms per group on
    reach's meta-batches), else the list."""
    first = group[0]
    if group == tuple(range(first, first + len(group))):
        return slice(first, first + len(group))
    return list(group)


def shift_offsets_seed(seed: int, epoch: int, *keys: int) -> np.random.SeedSequence:
    """The seed of an epoch's offsets (``keys``: the window pool's position, for windows),
    apart from every other draw of the feed."""
    return np.random.SeedSequence(seed + epoch, spawn_key=(_PURPOSE, *keys))


_PURPOSE = 7
"""Keeps the offsets' stream apart from the feeds' other draws (which use 0 and 1)."""
