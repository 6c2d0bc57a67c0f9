"""The outer update as a pure function: global norm and clipping, the non-finite policies,
Adam or SGD, and `weights_seq_no`, without reading anything back from the device.

`outer_update(rule, state, grads, inner)` returns the next `OuterState` and the step's
metrics as tensors. A non-finite value met under an `error` policy is recorded in the state
(`Failure`): that step and every later one leave the parameters, the optimizer state and
`weights_seq_no` as they were, and `OuterStep.check_finite` raises the error at the next
check point (one device sync instead of one per step). The eager meta-step runs the
function as it is; the compiled one runs it inside its single compiled function.

The moments live in the torch optimizer's own state (`torch.optim.Adam`'s `step`,
`exp_avg`, `exp_avg_sq`; `torch.optim.SGD`'s `momentum_buffer`), created in torch's format
when missing, so `optimizer.state_dict()` stays the checkpoint format and its
`param_groups` give each leaf its learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from learners.config import OuterConfig
from learners.inner.differentiable import NonFiniteGradientError, raise_on_nonfinite
from learners.inner.optim import global_norm

# Failure kinds, in `Failure.kind`.
_NONE, _INNER, _OUTER = 0, 1, 2
# Added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does.
_CLIP_EPS = 1e-6


class InnerCheck(NamedTuple):
    """What the inner updates of one meta-step met under `inner.nonfinite='error'`."""

    tasks: Tensor
    """Per trained module, in the learner's order: tasks whose inner gradient was
    non-finite (0 for a module the meta-batch does not hold)."""
    num_tasks: int


class Failure(NamedTuple):
    """The first non-finite value met under an `error` policy, kept on the device."""

    kind: Tensor
    """0: none; 1: an inner gradient; 2: the meta-gradient (int64)."""
    seq_no: Tensor
    """`weights_seq_no` when it was met."""
    norm: Tensor
    """The meta-gradient's global norm at that step."""
    inner_tasks: Tensor
    """Per trained module: tasks whose inner gradient was non-finite at that step."""
    num_tasks: Tensor
    """Tasks in that meta-step."""


class OuterState(NamedTuple):
    """Everything the outer update reads and replaces, as tensors."""

    leaves: list[Tensor]
    """Meta-parameters of the trained modules, then learned log learning rates."""
    slots: dict[str, list[Tensor]]
    """Optimizer state by name (Adam: exp_avg, exp_avg_sq; SGD: momentum_buffer), per leaf."""
    steps: list[Tensor]
    """Adam's step count, one per leaf as torch keeps it (every leaf steps together)."""
    seq_no: Tensor
    """`weights_seq_no`: applied updates (int64)."""
    failure: Failure


@dataclass(frozen=True)
class OuterRule:
    """The constants of the outer update: the optimizer's hyper-parameters per leaf (from
    its param groups) and the config's clipping and non-finite policies."""

    optimizer: str
    lrs: tuple[float, ...]
    weight_decays: tuple[float, ...]
    betas: tuple[float, float]
    eps: float
    momentum: float
    clip_norm: float | None
    outer_error: bool

    @classmethod
    def of(
        cls, config: OuterConfig, optimizer: torch.optim.Optimizer, leaves: list[Tensor]
    ) -> OuterRule:
        """The rule `optimizer` (built from `config` over `leaves`) applies."""
        group_of = {id(p): group for group in optimizer.param_groups for p in group["params"]}
        groups = [group_of[id(leaf)] for leaf in leaves]
        first = groups[0]
        return cls(
            optimizer=config.optimizer,
            lrs=tuple(float(g["lr"]) for g in groups),
            weight_decays=tuple(float(g["weight_decay"]) for g in groups),
            betas=tuple(first.get("betas", (0.0, 0.0))),
            eps=float(first.get("eps", 0.0)),
            momentum=float(first.get("momentum", 0.0)),
            clip_norm=config.clip_norm,
            outer_error=config.nonfinite == "error",
        )

    @property
    def slot_names(self) -> tuple[str, ...]:
        if self.optimizer == "adam":
            return ("exp_avg", "exp_avg_sq")
        return ("momentum_buffer",) if self.momentum else ()


def outer_update(
    rule: OuterRule, state: OuterState, grads: list[Tensor], inner: InnerCheck | None
) -> tuple[OuterState, dict[str, Tensor]]:
    """The state after one outer step with `grads` (one per leaf), and the step's metrics:
    `grad_norm` (before clipping), `outer_skipped` (1 when outer.nonfinite='skip' left a
    non-finite step out) and `weights_seq_no`, all tensors."""
    norm = global_norm(grads)
    finite = torch.isfinite(norm)
    if rule.clip_norm is not None:
        grads = torch._foreach_mul(grads, torch.clamp(rule.clip_norm / (norm + _CLIP_EPS), max=1.0))
    old = state.failure
    kind = torch.zeros_like(old.kind)
    if rule.outer_error:
        kind = torch.where(finite, kind, _OUTER)
    inner_tasks = old.inner_tasks
    num_tasks = old.num_tasks
    if inner is not None:
        inner_tasks = inner.tasks.to(old.inner_tasks.dtype)
        num_tasks = torch.full_like(old.num_tasks, inner.num_tasks)
        kind = torch.where(inner_tasks.sum() > 0, _INNER, kind)
    failed_before = old.kind != _NONE
    current = Failure(kind, state.seq_no, norm.to(old.norm.dtype), inner_tasks, num_tasks)
    pairs = zip(old, current, strict=True)
    failure = Failure(*(torch.where(failed_before, o, c) for o, c in pairs))
    apply = finite & (failure.kind == _NONE)
    if rule.optimizer == "adam":
        leaves, slots, steps = _adam(rule, state, grads)
    else:
        leaves, slots, steps = _sgd(rule, state, grads)
    new = OuterState(
        leaves=_select(apply, leaves, state.leaves),
        slots={name: _select(apply, slots[name], state.slots[name]) for name in slots},
        steps=_select(apply, steps, state.steps),
        seq_no=state.seq_no + apply.to(state.seq_no.dtype),
        failure=failure,
    )
    skipped = ~finite & (failure.kind == _NONE)
    metrics = {"grad_norm": norm, "outer_skipped": skipped.to(state.seq_no.dtype)}
    metrics["weights_seq_no"] = new.seq_no
    return new, metrics


class OuterStep:
    """The live side of `outer_update`: reads an `OuterState` from the learner's leaves, the
    torch optimizer's state and its own counters, and writes the next one back in place."""

    def __init__(
        self,
        rule: OuterRule,
        optimizer: torch.optim.Optimizer,
        leaves: list[Tensor],
        modules: list[str],
    ) -> None:
        self.rule = rule
        self._optimizer = optimizer
        self._leaves = leaves
        # Views without autograd history: the update reads and writes values only.
        self._values = [leaf.detach() for leaf in leaves]
        first = leaves[0]
        self._seq_no = torch.zeros((), dtype=torch.int64, device=first.device)
        self._modules = tuple(modules)
        self._failure = _no_failure(first, len(modules))
        self._live: OuterState | None = None
        self._live_source: object = None

    def state(self) -> OuterState:
        """The live tensors (writing to them changes the learner).

        Built once and kept until `reset`, or until the optimizer's state is replaced (its
        `load_state_dict` swaps the whole dict): every update writes into these tensors."""
        if self._live is None or self._live_source is not self._optimizer.state:
            self._live = self._read_state()
            self._live_source = self._optimizer.state
        return self._live

    def _read_state(self) -> OuterState:
        slots: dict[str, list[Tensor]] = {name: [] for name in self.rule.slot_names}
        steps: list[Tensor] = []
        stateless = not slots and self.rule.optimizer != "adam"  # SGD without momentum
        for leaf in [] if stateless else self._leaves:
            entry = self._optimizer.state[leaf]
            if not entry:
                self._init_entry(entry, leaf)
            for name, tensors in slots.items():
                tensors.append(entry[name])
            if self.rule.optimizer == "adam":
                step = entry["step"]
                if step.device != leaf.device and leaf.device.type != "cpu":
                    # A checkpoint from a CPU run keeps Adam's step on the CPU; on a GPU it
                    # belongs beside the leaf, or every update would copy it back.
                    step = entry["step"] = step.to(leaf.device)
                steps.append(step)
        return OuterState(self._values, slots, steps, self._seq_no, self._failure)

    def apply(self, grads: list[Tensor], inner: InnerCheck | None) -> dict[str, Tensor]:
        """One eager outer update of the live state; returns its metrics."""
        with torch.no_grad():
            live = self.state()
            new, metrics = outer_update(self.rule, live, grads, inner)
            self.write(live, new)
        return metrics

    def write(self, live: OuterState, new: OuterState) -> None:
        """Copy `new` into the live tensors `live` (from `state()`)."""
        with torch.no_grad():
            copy_state(live, new)

    @property
    def weights_seq_no(self) -> int:
        """Applied updates (one device sync)."""
        return int(self._seq_no)

    def reset(self, weights_seq_no: int) -> None:
        """Set the counter and forget any recorded failure (a state was loaded)."""
        self._seq_no.fill_(weights_seq_no)
        self._failure = _no_failure(self._leaves[0], len(self._modules))
        self._live = None

    def check_finite(self) -> None:
        """Raise `NonFiniteGradientError` for the first non-finite value met under an `error`
        policy, if any (one device sync). It stays recorded until `reset`."""
        failure = self._failure
        kind = int(failure.kind)
        if kind == _NONE:
            return
        seq_no = int(failure.seq_no)
        if kind == _OUTER:
            raise NonFiniteGradientError(
                f"non-finite meta-gradient (norm {float(failure.norm)}) at weights_seq_no "
                f"{seq_no}; set outer.clip_norm, lower the learning rates, or choose "
                "outer.nonfinite='skip'"
            )
        counts = dict(zip(self._modules, failure.inner_tasks.unbind(), strict=True))
        raise_on_nonfinite(
            {m: {"nonfinite": count} for m, count in counts.items()},
            f"met in {{count}} of {int(failure.num_tasks)} tasks at weights_seq_no {seq_no}",
        )

    def _init_entry(self, entry: dict, leaf: Tensor) -> None:
        """Torch's own initial state for `leaf` (what its first `step()` would create)."""
        for name in self.rule.slot_names:
            entry[name] = torch.zeros_like(leaf, memory_format=torch.preserve_format)
        if self.rule.optimizer == "adam":
            # torch keeps a non-capturable Adam's step on the CPU, in the default float type.
            device = leaf.device if leaf.device.type != "cpu" else None
            entry["step"] = torch.zeros((), dtype=_scalar_dtype(), device=device)


def copy_state(live: OuterState, new: OuterState) -> None:
    """Copy every tensor of `new` into the same place of `live`."""
    if torch.compiler.is_compiling():
        # One copy per tensor: torch.compile folds them into the kernels that produce them
        # (and its lowering of one _foreach_copy_ over mixed dtypes and shapes lost values).
        for target, value in zip(_flat(live), _flat(new), strict=True):
            target.copy_(value)
    else:
        torch._foreach_copy_(_flat(live), _flat(new))


def _adam(
    rule: OuterRule, state: OuterState, grads: list[Tensor]
) -> tuple[list[Tensor], dict[str, list[Tensor]], list[Tensor]]:
    """torch.optim.Adam's update (amsgrad off), out of place."""
    leaves = state.leaves
    if any(rule.weight_decays):
        grads = [g + wd * p for g, p, wd in zip(grads, leaves, rule.weight_decays, strict=True)]
    beta1, beta2 = rule.betas
    step = state.steps[0] + 1
    # In float64, as torch computes them from the step as a Python float: 1 - 0.999 ** t
    # in float32 loses 4 or 5 digits to cancellation.
    count = step.to(device=leaves[0].device, dtype=torch.float64)
    dtype = leaves[0].dtype
    correction1 = (1 - beta1**count).to(dtype)
    correction2_sqrt = torch.sqrt(1 - beta2**count).to(dtype)
    exp_avg = torch._foreach_lerp(state.slots["exp_avg"], grads, 1 - beta1)
    exp_avg_sq = torch._foreach_mul(state.slots["exp_avg_sq"], beta2)
    torch._foreach_addcmul_(exp_avg_sq, grads, grads, value=1 - beta2)
    denominators = torch._foreach_sqrt(exp_avg_sq)
    torch._foreach_div_(denominators, correction2_sqrt)
    torch._foreach_add_(denominators, rule.eps)
    directions = torch._foreach_div(exp_avg, denominators)
    torch._foreach_div_(directions, correction1)
    new_leaves = torch._foreach_add(leaves, _scaled(directions, rule.lrs))
    slots = {"exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    return new_leaves, slots, [step] * len(leaves)


def _sgd(
    rule: OuterRule, state: OuterState, grads: list[Tensor]
) -> tuple[list[Tensor], dict[str, list[Tensor]], list[Tensor]]:
    """torch.optim.SGD's update (no dampening, no Nesterov), out of place. The momentum
    buffer starts at zero, so its first value is the gradient, as torch's is."""
    leaves = state.leaves
    if any(rule.weight_decays):
        grads = [g + wd * p for g, p, wd in zip(grads, leaves, rule.weight_decays, strict=True)]
    slots: dict[str, list[Tensor]] = {}
    if rule.momentum:
        buffers = torch._foreach_mul(state.slots["momentum_buffer"], rule.momentum)
        torch._foreach_add_(buffers, grads)
        slots["momentum_buffer"] = grads = buffers
    return torch._foreach_add(leaves, _scaled(grads, rule.lrs)), slots, []


def _scaled(directions: list[Tensor], lrs: tuple[float, ...]) -> list[Tensor]:
    """Each direction times minus its learning rate."""
    if len(set(lrs)) == 1:
        return torch._foreach_mul(directions, -lrs[0])
    # A list of scalars has no torch.compile lowering; one product per tensor fuses.
    return [d * -lr for d, lr in zip(directions, lrs, strict=True)]


def _select(condition: Tensor, new: list[Tensor], old: list[Tensor]) -> list[Tensor]:
    """`new` where the 0-d `condition` holds, else `old`, exactly (NaN in the other
    branch does not leak)."""
    return [torch.where(condition, n, o) for n, o in zip(new, old, strict=True)]


def _flat(state: OuterState) -> list[Tensor]:
    slots = [t for name in sorted(state.slots) for t in state.slots[name]]
    return [*state.leaves, *slots, *state.steps, state.seq_no, *state.failure]


def _no_failure(like: Tensor, modules: int) -> Failure:
    def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> Tensor:
        return torch.zeros(shape, dtype=dtype, device=like.device)

    return Failure(zeros(), zeros(), zeros(dtype=like.dtype), zeros(modules), zeros())


def _scalar_dtype() -> torch.dtype:
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32
