"""Functional, differentiable inner optimizers and learned learning rates.

Every function here takes tensors and returns new tensors: nothing is written in place, so
the update can be differentiated (second-order MAML) and vmapped over tasks. An optimizer
works on one module's parameters `{name: Tensor}`; its state goes in and comes back out.

Learned learning rates (Meta-SGD) live in log space, flat-keyed `module_id` (one per module)
or `module_id/param_name` (per tensor or per element), and are expanded to a tree of positive
rates shaped like the parameters by `lrs_from_log`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from learners.config import InnerConfig
from learners.params import Params

NamedTensors = dict[str, Tensor]
OptState = dict[str, Tensor | NamedTensors]
"""One module's optimizer state: sgd {}; momentum {"momentum"}; adam {"step", "exp_avg",
"exp_avg_sq"} (the step count is a tensor so that a skipped step can leave it unchanged)."""

LearningRate = float | Mapping[str, Tensor]
"""A float for every parameter, or one tensor per parameter name broadcastable to it."""


def inside_vmap() -> bool:
    """Whether the caller runs inside `torch.func.vmap` (where a tensor cannot steer Python
    control flow, so a check that must raise has to wait until after the vmapped call), or
    is being compiled by `torch.compile`, where the same holds."""
    if torch.compiler.is_compiling():
        return True
    # torch.func has no public query for this; the functorch interpreter stack knows.
    stack = torch._C._functorch.get_interpreter_stack() or ()
    return any(level.key() == torch._C._functorch.TransformType.Vmap for level in stack)


def global_norm(grads: Mapping[str, Tensor] | list[Tensor]) -> Tensor:
    """The L2 norm of all tensors together (non-finite if any entry is)."""
    tensors = list(grads.values()) if isinstance(grads, Mapping) else grads
    if torch.compiler.is_compiling():
        # torch.compile lowers neither vector norms under vmap nor _foreach_norm to fused
        # code; a sum of squares is one fused reduction.
        return torch.sqrt(torch.stack([g.square().sum() for g in tensors]).sum())
    if isinstance(grads, Mapping):
        # Per-tensor norms: on CPU this beats torch._foreach_norm, which has no vmap rule.
        norms = [torch.linalg.vector_norm(g) for g in tensors]
    else:
        norms = torch._foreach_norm(tensors)
    return torch.linalg.vector_norm(torch.stack(norms))


def clip_by_global_norm(grads: NamedTensors, max_norm: float, norm: Tensor) -> NamedTensors:
    """`grads` scaled down so that their global norm (`norm`) is at most `max_norm`."""
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    return {name: g * scale for name, g in grads.items()}


def zero_nonfinite(grads: NamedTensors) -> NamedTensors:
    """Every NaN and ±inf entry replaced by 0 (never by the largest float)."""
    return {name: torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for name, g in grads.items()}


def select(condition: Tensor, when_true: NamedTensors, when_false: NamedTensors) -> NamedTensors:
    """Per name, `when_true` where the scalar `condition` holds, else `when_false` (exactly)."""
    return {name: torch.where(condition, t, when_false[name]) for name, t in when_true.items()}


class InnerOptimizer:
    """SGD, heavy-ball momentum or Adam as pure functions of (params, grads, state, lr)."""

    def __init__(self, config: InnerConfig) -> None:
        self.kind = config.optimizer
        self.momentum = config.momentum
        self.beta1, self.beta2 = config.betas
        self.eps = config.eps
        self.eps_root = config.eps_root

    def init(self, params: Mapping[str, Tensor]) -> OptState:
        """The zero state for one module's parameters."""
        if self.kind == "sgd":
            return {}
        zeros = {name: torch.zeros_like(p) for name, p in params.items()}
        if self.kind == "momentum":
            return {"momentum": zeros}
        first = next(iter(params.values()))
        return {
            "step": torch.zeros((), dtype=first.dtype, device=first.device),
            "exp_avg": zeros,
            "exp_avg_sq": {name: torch.zeros_like(p) for name, p in params.items()},
        }

    def step(
        self, params: NamedTensors, grads: NamedTensors, state: OptState, lr: LearningRate
    ) -> tuple[NamedTensors, OptState]:
        """New parameters and state after one step; inputs are left untouched."""
        if self.kind == "sgd":
            return _descend(params, grads, lr), state
        if self.kind == "momentum":
            previous = state["momentum"]
            velocity = {n: g + self.momentum * previous[n] for n, g in grads.items()}
            return _descend(params, velocity, lr), {"momentum": velocity}
        return self._adam(params, grads, state, lr)

    def _adam(
        self, params: NamedTensors, grads: NamedTensors, state: OptState, lr: LearningRate
    ) -> tuple[NamedTensors, OptState]:
        b1, b2 = self.beta1, self.beta2
        step = state["step"] + 1
        exp_avg = {n: b1 * state["exp_avg"][n] + (1 - b1) * g for n, g in grads.items()}
        exp_avg_sq = {
            n: b2 * state["exp_avg_sq"][n] + (1 - b2) * g.square() for n, g in grads.items()
        }
        correction1 = 1 - torch.pow(b1, step)
        correction2 = 1 - torch.pow(b2, step)
        directions = {
            n: (exp_avg[n] / correction1)
            / (torch.sqrt(exp_avg_sq[n] / correction2 + self.eps_root) + self.eps)
            for n in grads
        }
        new_state: OptState = {"step": step, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
        return _descend(params, directions, lr), new_state


def _descend(params: NamedTensors, directions: NamedTensors, lr: LearningRate) -> NamedTensors:
    if isinstance(lr, float | int):
        return {n: torch.add(p, directions[n], alpha=-lr) for n, p in params.items()}
    return {n: p - lr[n] * directions[n] for n, p in params.items()}


def select_state(condition: Tensor, new: OptState, old: OptState) -> OptState:
    """The optimizer state `new` where `condition` holds, else `old`, entry by entry."""
    chosen: OptState = {}
    for key, value in new.items():
        if isinstance(value, Tensor):
            chosen[key] = torch.where(condition, value, old[key])
        else:
            chosen[key] = select(condition, value, old[key])
    return chosen


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
