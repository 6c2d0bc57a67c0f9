"""The outer update in place, for leaves in host memory: torch.optim's multi-tensor Adam and
SGD (`_multi_tensor_adam`, `_multi_tensor_sgd`) written into the optimizer's own slots.

On the CPU a 0-d tensor is read without waiting for any device, so the eager meta-step there
decides in Python whether a step is applied (`learners.meta.outer_step.OuterStep.apply`) and
then does only that step's work: one fused call per operation over every leaf, as
`torch.optim.Adam(foreach=True)` does, instead of the pure `outer_update`, which computes the
next state out of place and selects it with `torch.where` so that a GPU never has to report
back. The arithmetic is torch's own, in its order: the bias corrections as Python floats
from the step count, the update as one `addcdiv` with `-lr / correction1`.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from learners.meta.outer_optim import TorchAdamState, TorchMomentumState
from learners.torch_compat import (
    foreach_add,
    foreach_add_,
    foreach_addcdiv_,
    foreach_addcmul_,
    foreach_div_,
    foreach_lerp_,
    foreach_mul,
    foreach_mul_,
    foreach_sqrt,
)

# Added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does.
_CLIP_EPS = 1e-6


def step_in_place(
    params: list[Tensor],
    grads: Sequence[Tensor],
    slots: TorchAdamState | TorchMomentumState | None,
    norm: Tensor,
    *,
    lrs: tuple[float, ...],
    weight_decays: tuple[float, ...],
    betas: tuple[float, float],
    eps: float,
    momentum: float,
    clip_norm: float | None,
) -> None:
    """One outer step on `params` and `slots` (the optimizer's tensors: Adam's, SGD's momentum
    buffers, or None for plain SGD), in place, with an `OuterRule`'s hyper-parameters.

    `norm` is the global norm of `grads`, already measured; `grads` are left untouched."""
    updates = list(grads)
    if clip_norm is not None:
        # torch.nn.utils.clip_grad_norm_'s factor, kept as a tensor (no read of the norm).
        scale = (clip_norm / (norm + _CLIP_EPS)).clamp(max=1.0)
        updates = foreach_mul(updates, scale)
    updates = _decayed(updates, params, weight_decays)
    if isinstance(slots, TorchAdamState):
        _adam(slots, params, updates, lrs, betas, eps)
    elif isinstance(slots, TorchMomentumState):
        buffers = slots.momentum_buffer
        # The buffers start at zero, so the first step's buffer is the gradient, as torch's.
        foreach_mul_(buffers, momentum)
        foreach_add_(buffers, updates)
        _descend(params, buffers, lrs)
    else:
        _descend(params, updates, lrs)


def _decayed(
    updates: list[Tensor], params: list[Tensor], weight_decays: tuple[float, ...]
) -> list[Tensor]:
    """torch.optim's L2 penalty: each gradient plus its leaf times its weight decay."""
    if not any(weight_decays):
        return updates
    if len(set(weight_decays)) == 1:
        return foreach_add(updates, params, alpha=weight_decays[0])
    pairs = zip(updates, params, weight_decays, strict=True)
    return [u.add(p, alpha=wd) if wd else u for u, p, wd in pairs]


def _adam(
    slots: TorchAdamState,
    params: list[Tensor],
    grads: list[Tensor],
    lrs: tuple[float, ...],
    betas: tuple[float, float],
    eps: float,
) -> None:
    beta1, beta2 = betas
    steps = list(slots.step)
    foreach_add_(steps, 1.0)
    foreach_lerp_(slots.exp_avg, grads, 1 - beta1)
    foreach_mul_(slots.exp_avg_sq, beta2)
    foreach_addcmul_(slots.exp_avg_sq, grads, grads, value=1 - beta2)
    # Every leaf steps together: one count serves them all (torch reads each as a float).
    count = float(steps[0])
    correction1 = 1 - beta1**count
    correction2_sqrt = (1 - beta2**count) ** 0.5
    denominators = foreach_sqrt(slots.exp_avg_sq)
    foreach_div_(denominators, correction2_sqrt)
    foreach_add_(denominators, eps)
    foreach_addcdiv_(params, slots.exp_avg, denominators, [-lr / correction1 for lr in lrs])


def _descend(params: list[Tensor], directions: list[Tensor], lrs: tuple[float, ...]) -> None:
    if len(set(lrs)) == 1:
        foreach_add_(params, directions, alpha=-lrs[0])
        return
    for p, d, lr in zip(params, directions, lrs, strict=True):
        p.add_(d, alpha=-lr)
