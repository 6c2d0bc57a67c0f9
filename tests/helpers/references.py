"""Hand-written references the learner tests compare against: the MSE the built-in `mse` loss
computes, and central finite differences of a scalar objective."""

from __future__ import annotations

from collections.abc import Callable

import torch

FD_STEP = 1e-6
"""The finite-difference step: in float64, small enough for the truncation error and large
enough that rounding, divided by 2 * FD_STEP, stays below the tests' tolerances."""


def reference_mse(outputs: torch.Tensor, columns: dict) -> torch.Tensor:
    """The reference MSE of model outputs to `actions` (what the built-in `mse` loss computes
    from the module's forward)."""
    target = columns["actions"]
    return (outputs.reshape(target.shape) - target).square().mean()


def central_differences(objective: Callable[[], float], leaf: torch.Tensor) -> torch.Tensor:
    """The derivative of `objective()` in every element of `leaf`, estimated by moving that
    element `FD_STEP` up and down in place (restored afterwards)."""
    flat = leaf.detach().view(-1)
    estimate = torch.empty_like(flat)
    for j in range(flat.numel()):
        original = float(flat[j])
        up, down = original + FD_STEP, original - FD_STEP
        flat[j] = up
        plus = objective()
        flat[j] = down
        minus = objective()
        flat[j] = original
        estimate[j] = (plus - minus) / (up - down)  # the step actually taken, after rounding
    return estimate.view_as(leaf)
