"""The episode data contract: canonical columns, the validated schema, and its errors."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_MODULE_ID = "default_policy"
DEFAULT_TASK_ID = "default_task"

REQUIRED_COLUMNS = ("eps_id", "t", "obs", "actions", "rewards", "terminateds", "truncateds")
OPTIONAL_COLUMNS = ("new_obs", "task_id", "module_id")

CheckValues = Literal["full", "sample", "off"]
"""How much of the value columns validation scans (``pipeline.contract.value_checks``)."""

ObservationLayout = Literal["CHW", "HWC"]
"""Axis order of one uint8 image observation: ``[C, H, W]`` or ``[H, W, C]``."""


class DatasetError(ValueError):
    """A dataset was refused: the message names the file, the column, what was found
    and what was expected."""


@dataclass(frozen=True)
class EpisodeSchema:
    """What ``read_episodes`` established about a dataset, in canonical column names."""

    obs_shape: tuple[int, ...]
    """Shape of one observation as stored, e.g. ``(16,)`` or ``(64, 64, 3)``."""
    action_shape: tuple[int, ...]
    """Shape of one action; ``()`` for discrete actions."""
    discrete_actions: bool
    """True when ``actions`` is int64 (class indices), False for float32 tensors."""
    eps_id_type: str
    """``"string"`` or ``"int64"``."""
    has_new_obs: bool = False
    has_task_id: bool = False
    """Without a ``task_id`` column every row belongs to ``DEFAULT_TASK_ID``."""
    has_module_id: bool = False
    """Without a ``module_id`` column every row belongs to ``DEFAULT_MODULE_ID``."""
    extra_columns: tuple[str, ...] = ()
    """Columns outside the contract, passed through when selected."""
    column_map: Mapping[str, str] = field(default_factory=dict)
    """Canonical name -> name on disk, for the columns that were renamed."""
    obs_layout: ObservationLayout | None = None
    """Axis order of uint8 image observations (``dataset.json`` ``observation_layout``,
    default ``CHW``); ``None`` for float32 observations."""

    @property
    def module_obs_shape(self) -> tuple[int, ...]:
        """Shape of one observation as a module sees it after finalize: ``[C, H, W]`` for
        images whatever their stored layout, the stored shape otherwise."""
        if self.obs_layout == "HWC":
            height, width, channels = self.obs_shape
            return (channels, height, width)
        return self.obs_shape
