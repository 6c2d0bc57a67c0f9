"""The links of the outer update that reproduce `torch.optim`: Adam (amsgrad off), SGD with
momentum (no dampening, no Nesterov), L2 weight decay and per-group learning rates, over
lists of leaves with torch's fused foreach kernels, out of place.

Their states hold torch's own slots by torch's own names (`step`, `exp_avg`, `exp_avg_sq`,
`momentum_buffer`: one tensor per leaf), so that `optimizer.state_dict()` stays the
checkpoint format (`learners.meta.outer_step.OuterStep` reads and writes them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeVar

import torch
from torch import Tensor

from learners.torch_compat import (
    foreach_add_,
    foreach_addcmul_,
    foreach_div,
    foreach_div_,
    foreach_lerp,
    foreach_mul,
    foreach_sqrt,
)
from learners.transforms import StepInputs, Tensors, Transform, stateless


class TorchAdamState(NamedTuple):
    """torch.optim.Adam's slots, one tensor per leaf."""

    step: Tensors
    """Steps taken (every leaf steps together: torch keeps one count per leaf)."""
    exp_avg: Tensors
    exp_avg_sq: Tensors


class TorchMomentumState(NamedTuple):
    """torch.optim.SGD's slot, one tensor per leaf."""

    momentum_buffer: Tensors


_Slots = TypeVar("_Slots", TorchAdamState, TorchMomentumState)


def scale_by_torch_adam(betas: tuple[float, float], eps: float) -> Transform:
    """torch.optim.Adam's direction `m_hat / (sqrt(v_hat) + eps)`, in torch's order of
    operations."""
    beta1, beta2 = betas

    def init(params: Sequence[Tensor]) -> TorchAdamState:
        return _initial(TorchAdamState, params)

    def update(
        grads: Tensors, state: TorchAdamState, inputs: StepInputs
    ) -> tuple[Tensors, TorchAdamState]:
        step = state.step[0] + 1
        first = inputs.params[0]
        # In float64, as torch computes them from the step as a Python float: 1 - 0.999 ** t
        # in float32 loses 4 or 5 digits to cancellation.
        count = step.to(device=first.device, dtype=torch.float64)
        correction1 = (1 - beta1**count).to(first.dtype)
        correction2_sqrt = torch.sqrt(1 - beta2**count).to(first.dtype)
        exp_avg = foreach_lerp(state.exp_avg, grads, 1 - beta1)
        exp_avg_sq = foreach_mul(state.exp_avg_sq, beta2)
        foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
        denominators = foreach_sqrt(exp_avg_sq)
        foreach_div_(denominators, correction2_sqrt)
        foreach_add_(denominators, eps)
        directions = foreach_div(exp_avg, denominators)
        foreach_div_(directions, correction1)
        return directions, TorchAdamState([step] * len(grads), exp_avg, exp_avg_sq)

    return Transform(init, update)


def scale_by_torch_momentum(momentum: float) -> Transform:
    """torch.optim.SGD's momentum buffer `momentum * buffer + g`. It starts at zero, so its
    first value is the gradient, as torch's is."""

    def init(params: Sequence[Tensor]) -> TorchMomentumState:
        return _initial(TorchMomentumState, params)

    def update(
        grads: Tensors, state: TorchMomentumState, inputs: StepInputs
    ) -> tuple[Tensors, TorchMomentumState]:
        buffers = foreach_mul(state.momentum_buffer, momentum)
        foreach_add_(buffers, grads)
        return buffers, TorchMomentumState(buffers)

    return Transform(init, update)


def add_decayed_weights(weight_decays: tuple[float, ...]) -> Transform:
    """torch.optim's L2 penalty: each gradient plus its leaf times the leaf's weight decay."""

    def decay(grads: Tensors, inputs: StepInputs) -> Tensors:
        pairs = zip(grads, inputs.params, weight_decays, strict=True)
        return [g + wd * p for g, p, wd in pairs]

    return stateless(decay)


def scale_by_group_lrs(lrs: tuple[float, ...]) -> Transform:
    """Each direction times its leaf's learning rate (its param group's)."""

    uniform = len(set(lrs)) == 1

    def scale(directions: Tensors, inputs: StepInputs) -> Tensors:
        if uniform:
            return foreach_mul(directions, lrs[0])
        # A list of scalars has no torch.compile lowering; one product per tensor fuses.
        return [d * lr for d, lr in zip(directions, lrs, strict=True)]

    return stateless(scale)


def initial_slot(name: str, leaf: Tensor) -> Tensor:
    """What torch.optim's first `step()` creates as slot `name` of `leaf`."""
    if name == "step":
        # torch keeps a non-capturable Adam's step on the CPU, in the default float type.
        device = leaf.device if leaf.device.type != "cpu" else None
        dtype = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
        return torch.zeros((), dtype=dtype, device=device)
    return torch.zeros_like(leaf, memory_format=torch.preserve_format)


def _initial(state: type[_Slots], params: Sequence[Tensor]) -> _Slots:
    return state(*([initial_slot(name, p) for p in params] for name in state._fields))
