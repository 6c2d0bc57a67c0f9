"""How far apart two floating-point results may be when they differ by rounding alone.

Two computations of one value that order or group their rounded operations differently
(vmap against a loop, a functional update against `torch.optim`, one learner against
averaged shards, a float64 reference against float32 data) agree up to rounding. Each
rounded operation is off by at most u = eps/2 of its result (eps = `finfo(dtype).eps`, the
gap between 1 and the next float). If no value on the way exceeds `magnitude` in absolute
terms and the operations do not amplify an error (sums, products with factors of at most 1,
tanh), a chain of `ops` operations ends at most `ops * u * magnitude` from the exact value,
so two such chains end at most `ops * eps * magnitude` apart. Where a computation does
amplify errors (a division by a small number, an ill-conditioned step) the factor belongs in
`magnitude`, and the test says so.

Each test derives its tolerance here from the dtype in play, the magnitudes of its values and
a count of the operations behind them, with a comment on the count, instead of writing a
bare number.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch


def rounding_tolerance(
    dtype: torch.dtype | np.dtype | type, *, magnitude: float, ops: int
) -> float:
    """The largest absolute difference rounding alone explains between two computations in
    `dtype` of one value: `ops * finfo(dtype).eps * magnitude` (see the module docstring).

    `magnitude` bounds the absolute values on the way (an observed maximum is fine: the bound
    is first-order); `ops` counts the rounded operations along the longest chain behind one
    result, both computations alike. `dtype` is a torch or a NumPy floating dtype.
    """
    if ops < 1 or not magnitude >= 0:
        raise ValueError(f"ops must be >= 1 and magnitude >= 0, got ops={ops}, {magnitude=}")
    eps = torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) else np.finfo(dtype).eps
    if ops * eps / 2 >= 0.5:
        raise ValueError(f"{ops} operations in {dtype} can lose every digit; no bound holds")
    return ops * eps * magnitude


def largest(values: Iterable[torch.Tensor | np.ndarray | float]) -> float:
    """The largest absolute value among tensors, arrays and numbers: a `magnitude`."""
    return max(
        float(v.detach().abs().max()) if isinstance(v, torch.Tensor) else float(np.max(np.abs(v)))
        for v in values
    )


def trajectory_tolerance(
    dtype: torch.dtype, *, steps: int, step_size: float, params_magnitude: float, ops: int
) -> float:
    """The largest absolute difference rounding alone explains between the parameters of two
    runs of `steps` optimizer steps whose gradients differ only by rounding (shards averaged
    against one batch, a run resumed from a checkpoint against an uninterrupted one).

    Each step moves a parameter by at most `step_size` (Adam: its lr, as |m / sqrt(v)| stays
    about 1 at most) in a direction carrying the gradients' relative rounding, `ops`
    operations deep; the update itself rounds the parameter, of at most `params_magnitude`,
    about 3 times (a product, a quotient, a sum). Adam divides each gradient entry by its own
    size, so this holds while no entry is within its rounding of zero (an exact 0 stays 0).
    """
    per_step = rounding_tolerance(dtype, magnitude=step_size, ops=ops)
    per_step += rounding_tolerance(dtype, magnitude=params_magnitude, ops=3)
    return steps * per_step
