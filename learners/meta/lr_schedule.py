"""The outer learning rate's schedule: a factor of every leaf's learning rate by the number
of applied outer updates (`weights_seq_no`), so a resumed run continues it exactly.

- constant: 1 (with `warmup_steps`, the warm-up alone).
- cosine: after the warm-up, from 1 down to `min_lr_ratio` along half a cosine over
  `decay_steps` updates, then `min_lr_ratio` (Loshchilov and Hutter 2017, without restarts).

Warm-up: update t (from 0) of the first `warmup_steps` uses `(t + 1) / warmup_steps`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class LrSchedule(NamedTuple):
    """The schedule's constants (`OuterConfig`'s schedule fields)."""

    kind: str
    warmup_steps: int
    decay_steps: int | None
    min_lr_ratio: float

    @property
    def constant(self) -> bool:
        """Whether every update uses the configured rates as they are."""
        return self.kind == "constant" and self.warmup_steps == 0

    def factor(self, seq_no: Tensor) -> Tensor:
        """The factor of the update after `seq_no` applied ones (a 0-d tensor, float64),
        computed without reading the tensor back (it may live on a device)."""
        t = seq_no.to(torch.float64)
        factor = torch.ones_like(t)
        if self.warmup_steps:
            factor = torch.clamp((t + 1) / self.warmup_steps, max=1.0)
        if self.kind == "cosine":
            assert self.decay_steps is not None  # OuterConfig requires it for cosine
            progress = torch.clamp((t - self.warmup_steps) / self.decay_steps, 0.0, 1.0)
            cosine = 0.5 * (1 + torch.cos(math.pi * progress))
            factor = factor * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cosine)
        return factor


CONSTANT = LrSchedule("constant", 0, None, 0.0)
"""The configured rates as they are."""
