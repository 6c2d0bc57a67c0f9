"""The inner optimizer as a chain of links, and learned learning rates.

`inner_optimizer(config)` composes the links of `learners.transforms` with the ones here
(heavy-ball momentum, Adam, the learning rate) into one pure rule over one module's
parameters in order; its state goes in and comes back out. Nothing is written in place, so
the update can be differentiated (second-order MAML) and vmapped over tasks.

Learned learning rates (Meta-SGD) live in log space, flat-keyed `module_id` (one per module)
or `module_id/param_name` (per tensor or per element), and are expanded to a tree of positive
rates shaped like the parameters by `lrs_from_log`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from learners.config import InnerConfig
from learners.params import Params
from learners.transforms import (
    StepInputs,
    Tensors,
    Transform,
    chain,
    clip_by_global_norm,
    skip_nonfinite,
    stateless,
    zero_nonfinite,
)

NamedTensors = dict[str, Tensor]


class MomentumState(NamedTuple):
    """Heavy-ball momentum's state."""

    velocity: Tensors
    """One per parameter."""


class AdamState(NamedTuple):
    """Adam's state."""

    step: Tensor
    """Steps taken: a tensor, so that a skipped step can leave it unchanged."""
    exp_avg: Tensors
    """First moments, one per parameter."""
    exp_avg_sq: Tensors
    """Second moments, one per parameter."""


def scale_by_momentum(momentum: float) -> Transform:
    """Heavy-ball momentum: the velocity `g + momentum * velocity` (torch.optim.SGD's)."""

    def init(params: Sequence[Tensor]) -> MomentumState:
        return MomentumState([torch.zeros_like(p) for p in params])

    def update(
        grads: Tensors, state: MomentumState, inputs: StepInputs
    ) -> tuple[Tensors, MomentumState]:
        velocity = [g + momentum * v for g, v in zip(grads, state.velocity, strict=True)]
        return velocity, MomentumState(velocity)

    return Transform(init, update)


def scale_by_adam(betas: tuple[float, float], eps: float, eps_root: float) -> Transform:
    """Adam's bias-corrected direction `m / (sqrt(v + eps_root) + eps)`; `eps_root` keeps the
    derivative of the square root finite where a gradient is exactly zero."""
    b1, b2 = betas

    def init(params: Sequence[Tensor]) -> AdamState:
        first = params[0]
        step = torch.zeros((), dtype=first.dtype, device=first.device)
        return AdamState(
            step, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
        )

    def update(grads: Tensors, state: AdamState, inputs: StepInputs) -> tuple[Tensors, AdamState]:
        step = state.step + 1
        exp_avg = [b1 * m + (1 - b1) * g for m, g in zip(state.exp_avg, grads, strict=True)]
        exp_avg_sq = [
            b2 * v + (1 - b2) * g.square() for v, g in zip(state.exp_avg_sq, grads, strict=True)
        ]
        correction1 = 1 - torch.pow(b1, step)
        correction2 = 1 - torch.pow(b2, step)
        directions = [
            (m / correction1) / (torch.sqrt(v / correction2 + eps_root) + eps)
            for m, v in zip(exp_avg, exp_avg_sq, strict=True)
        ]
        return directions, AdamState(step, exp_avg, exp_avg_sq)

    return Transform(init, update)


def scale_by_learning_rate(lr: float | None) -> Transform:
    """Each direction times its learning rate: the step's `inputs.rates` (Meta-SGD) when
    given, else `lr`. With `lr=None` and no rates the directions pass unchanged, for a caller
    that descends by its float rate itself (`descend(..., lr=)`, one fused kernel a tensor)."""

    def scale(directions: Tensors, inputs: StepInputs) -> Tensors:
        if inputs.rates is not None:
            return [r * d for r, d in zip(inputs.rates, directions, strict=True)]
        return directions if lr is None else [d * lr for d in directions]

    return stateless(scale)


_DIRECTIONS: dict[str, Callable[[InnerConfig], tuple[Transform, ...]]] = {
    "sgd": lambda config: (),
    "momentum": lambda config: (scale_by_momentum(config.momentum),),
    "adam": lambda config: (scale_by_adam(config.betas, config.eps, config.eps_root),),
}
"""The links between the gradient and the learning rate, per `InnerConfig.optimizer`."""
_POLICIES: dict[str, Callable[[Transform], Transform]] = {
    "skip": lambda rule: skip_nonfinite(rule, differentiated=True),
    "zero": zero_nonfinite,
}
"""The link wrapping the rule, per `InnerConfig.nonfinite`; 'error' checks the result once
after the update instead (`DifferentiableLearner.update`)."""


def inner_optimizer(config: InnerConfig) -> Transform:
    """The inner update rule `config` describes, over one module's parameters in order:
    clipping, SGD, heavy-ball momentum or Adam, the learning rate, inside the non-finite
    policy. With learned rates (Meta-SGD) its output is the step; without, the direction, which
    the caller descends by `config.lr` (`learners.transforms.descend(..., lr=config.lr)`: the
    scaling fused into the subtraction, as `torch.optim.SGD` does it)."""
    links = [] if config.clip_norm is None else [clip_by_global_norm(config.clip_norm)]
    rule = chain(*links, *_DIRECTIONS[config.optimizer](config), scale_by_learning_rate(None))
    policy = _POLICIES.get(config.nonfinite)
    return rule if policy is None else policy(rule)


def init_log_lrs(params: Params, mode: str, lr: float, modules: list[str]) -> dict[str, Tensor]:
    """Initial learned log learning rates for `modules` (all equal to `log(lr)`).

    `mode`: scalar (key `module_id`), tensor (key `module_id/name`, a 0-d tensor) or element
    (key `module_id/name`, shaped like the parameter).
    """
    if mode == "none":
        return {}
    value = math.log(lr)
    log_lrs: dict[str, Tensor] = {}
    for module_id in modules:
        named = params[module_id]
        first = next(iter(named.values()))
        if mode == "scalar":
            log_lrs[module_id] = torch.full((), value, dtype=first.dtype, device=first.device)
            continue
        for name, p in named.items():
            shape = p.shape if mode == "element" else ()
            log_lrs[f"{module_id}/{name}"] = torch.full(
                shape, value, dtype=p.dtype, device=p.device
            )
    return log_lrs


def lrs_from_log(log_lrs: Mapping[str, Tensor], params: Params, mode: str) -> Params:
    """Positive learning rates `{module_id: {name: Tensor}}` for the modules in `log_lrs`."""
    if mode == "scalar":
        return {
            mid: dict.fromkeys(params[mid], torch.exp(log_lr)) for mid, log_lr in log_lrs.items()
        }
    lrs: Params = {}
    for key, log_lr in log_lrs.items():
        module_id, _, name = key.partition("/")
        lrs.setdefault(module_id, {})[name] = torch.exp(log_lr)
    return lrs
