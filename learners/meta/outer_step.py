"""The outer update as a pure function: a chain of `learners.transforms` links (the
non-finite policy around clipping, weight decay, Adam or SGD and the learning rates), and
`weights_seq_no`, without reading anything back from the device.

`outer_update(rule, state, grads, inner)` returns the next `OuterState` and the step's
metrics as tensors. A non-finite value met under an `error` policy is recorded in the state
(`Failure`): that step and every later one leave the parameters, the optimizer state and
`weights_seq_no` as they were, and `OuterStep.check_finite` raises the error at the next
check point (one device sync instead of one per step). The eager meta-step runs the
function as it is; the compiled one runs it inside its single compiled function.

The moments live in the torch optimizer's own state (`torch.optim.Adam`'s `step`,
`exp_avg`, `exp_avg_sq`; `torch.optim.SGD`'s `momentum_buffer`: `learners.meta.outer_optim`),
created in torch's format when missing, so `optimizer.state_dict()` stays the checkpoint
format and its `param_groups` give each leaf its learning rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from torch import Tensor

from learners.config import OuterConfig
from learners.inner.differentiable import NonFiniteGradientError, raise_on_nonfinite
from learners.meta.host_update import step_in_place
from learners.meta.lr_schedule import CONSTANT, LrSchedule
from learners.meta.outer_optim import (
    TorchAdamState,
    TorchMomentumState,
    add_decayed_weights,
    initial_slot,
    scale_by_group_lrs,
    scale_by_torch_adam,
    scale_by_torch_momentum,
)
from learners.torch_compat import foreach_copy_
from learners.transforms import (
    EmptyState,
    NonFiniteState,
    StepInputs,
    Transform,
    chain,
    clip_by_global_norm,
    descend,
    global_norm,
    skip_nonfinite,
    tree_tensors,
)

# Failure kinds, in `Failure.kind`.
_NONE, _INNER, _OUTER = 0, 1, 2


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
    opt: NonFiniteState
    """The state of `OuterRule.transform`: torch's slots per leaf in the optimizer's link
    (`OuterRule.slots`), and the last step's global norm and finiteness."""
    seq_no: Tensor
    """`weights_seq_no`: applied updates (int64)."""
    failure: Failure


@dataclass(frozen=True)
class OuterRule:
    """The constants of the outer update: the optimizer's hyper-parameters per leaf (from
    its param groups), the config's clipping and non-finite policies, and the chain of links
    they make."""

    optimizer: str
    lrs: tuple[float, ...]
    weight_decays: tuple[float, ...]
    betas: tuple[float, float]
    eps: float
    momentum: float
    clip_norm: float | None
    outer_error: bool
    schedule: LrSchedule = CONSTANT
    """The factor of every learning rate by applied updates (`learners.meta.lr_schedule`)."""
    transform: Transform = field(init=False, compare=False, repr=False)
    """skip_nonfinite(chain(clip, weight decay, Adam or momentum, learning rates)), each link
    only where configured. Under outer.nonfinite='error' a non-finite step is skipped as
    well: `outer_update` records it and halts."""
    slots: type[NamedTuple] | None = field(init=False, compare=False, repr=False)
    """The state type of the link that keeps torch's slots (None: SGD without momentum);
    its field names are the slot names."""
    slot_link: int | None = field(init=False, compare=False, repr=False)
    """Which link of the chain keeps `slots` (None without one)."""
    _links: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        links = (
            [] if self.clip_norm is None else [clip_by_global_norm(self.clip_norm, foreach=True)]
        )
        if any(self.weight_decays):
            links.append(add_decayed_weights(self.weight_decays))
        slots: type[NamedTuple] | None = None
        if self.optimizer == "adam":
            slots = TorchAdamState
            links.append(scale_by_torch_adam(self.betas, self.eps))
        elif self.momentum:
            slots = TorchMomentumState
            links.append(scale_by_torch_momentum(self.momentum))
        slot_link = len(links) - 1 if slots is not None else None
        links.append(scale_by_group_lrs(self.lrs))
        transform = skip_nonfinite(chain(*links), foreach=True, differentiated=False)
        # A frozen dataclass: the derived fields are set once, here.
        object.__setattr__(self, "transform", transform)
        object.__setattr__(self, "slots", slots)
        object.__setattr__(self, "slot_link", slot_link)
        object.__setattr__(self, "_links", len(links))

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
            schedule=LrSchedule(
                config.schedule, config.warmup_steps, config.decay_steps, config.min_lr_ratio
            ),
        )

    def opt_state(self, slots: Any, norm: Tensor, finite: Tensor) -> NonFiniteState:
        """The transform's state around `slots` (a `self.slots`, or None without one)."""
        links: list[Any] = [EmptyState()] * self._links
        if self.slot_link is not None:
            links[self.slot_link] = slots
        return NonFiniteState(tuple(links), norm, finite)


def outer_update(
    rule: OuterRule, state: OuterState, grads: list[Tensor], inner: InnerCheck | None
) -> tuple[OuterState, dict[str, Tensor]]:
    """The state after one outer step with `grads` (one per leaf), and the step's metrics:
    `grad_norm` (before clipping), `outer_skipped` (1 when outer.nonfinite='skip' left a
    non-finite step out) and `weights_seq_no`, all tensors."""
    old = state.failure
    inner_tasks = old.inner_tasks
    num_tasks = old.num_tasks
    failed_before = old.kind != _NONE
    allowed = ~failed_before
    if inner is not None:
        inner_tasks = inner.tasks.to(old.inner_tasks.dtype)
        num_tasks = torch.full_like(old.num_tasks, inner.num_tasks)
        inner_failed = inner_tasks.sum() > 0
        allowed = allowed & ~inner_failed
    inputs = StepInputs(state.leaves, allowed=allowed)
    steps, opt = rule.transform.update(grads, state.opt, inputs)
    if not rule.schedule.constant:
        factor = rule.schedule.factor(state.seq_no).to(steps[0].dtype)
        steps = [step * factor for step in steps]
    norm, finite = opt.norm, opt.finite
    kind = torch.zeros_like(old.kind)
    if rule.outer_error:
        kind = torch.where(finite, kind, _OUTER)
    if inner is not None:  # an inner failure is the one reported
        kind = torch.where(inner_failed, _INNER, kind)
    current = Failure(kind, state.seq_no, norm.to(old.norm.dtype), inner_tasks, num_tasks)
    pairs = zip(old, current, strict=True)
    failure = Failure(*(torch.where(failed_before, o, c) for o, c in pairs))
    # What the transform applied: a finite step while nothing has failed.
    applied = finite & allowed
    new = OuterState(
        leaves=descend(state.leaves, steps, foreach=True),
        opt=opt,
        seq_no=state.seq_no + applied.to(state.seq_no.dtype),
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
        # The last step's global norm and finiteness, written by every update.
        self._norm = torch.zeros((), dtype=first.dtype, device=first.device)
        self._finite = torch.ones((), dtype=torch.bool, device=first.device)
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
        kind = self.rule.slots
        slots = None
        if kind is not None:
            per_name: dict[str, list[Tensor]] = {name: [] for name in kind._fields}
            for leaf in self._leaves:
                entry = self._optimizer.state[leaf]
                if not entry:  # torch's own initial state: what its first step() creates
                    entry.update({name: initial_slot(name, leaf) for name in kind._fields})
                step = entry.get("step")
                if step is not None and step.device != leaf.device and leaf.device.type != "cpu":
                    # A checkpoint from a CPU run keeps Adam's step on the CPU; on a GPU it
                    # belongs beside the leaf, or every update would copy it back.
                    entry["step"] = step.to(leaf.device)
                for name, tensors in per_name.items():
                    tensors.append(entry[name])
            slots = kind(**per_name)
        opt = self.rule.opt_state(slots, self._norm, self._finite)
        return OuterState(self._values, opt, self._seq_no, self._failure)

    def apply(self, grads: list[Tensor], inner: InnerCheck | None) -> dict[str, Tensor]:
        """One eager outer update of the live state; returns its metrics (those of
        `outer_update`).

        On the CPU it decides in Python whether the step applies and steps in place
        (`learners.meta.host_update`): reading a CPU tensor waits for nothing. Elsewhere it
        runs `outer_update`, which never reads a value back from the device."""
        with torch.no_grad():
            live = self.state()
            if self._values[0].device.type == "cpu":
                return self._apply_in_place(live, grads, inner)
            new, metrics = outer_update(self.rule, live, grads, inner)
            self.write(live, new)
        return metrics

    def _apply_in_place(
        self, live: OuterState, grads: list[Tensor], inner: InnerCheck | None
    ) -> dict[str, Tensor]:
        """`outer_update`'s step and bookkeeping, decided on the host and written in place."""
        rule = self.rule
        norm = global_norm(grads, foreach=True)
        finite = bool(torch.isfinite(norm))
        failure = self._failure
        kind = int(failure.kind)
        if kind == _NONE:
            inner_failed = inner is not None and bool(inner.tasks.any())
            if inner_failed:  # an inner failure is the one reported
                kind = _INNER
            elif rule.outer_error and not finite:
                kind = _OUTER
            if kind != _NONE:
                self._record(kind, norm, inner)
            elif finite:
                slots = live.opt.inner[rule.slot_link] if rule.slot_link is not None else None
                lrs = rule.lrs
                if not rule.schedule.constant:
                    factor = float(rule.schedule.factor(self._seq_no))
                    lrs = tuple(lr * factor for lr in lrs)
                step_in_place(
                    live.leaves,
                    grads,
                    slots,
                    norm,
                    lrs=lrs,
                    weight_decays=rule.weight_decays,
                    betas=rule.betas,
                    eps=rule.eps,
                    momentum=rule.momentum,
                    clip_norm=rule.clip_norm,
                )
                self._seq_no += 1
        self._norm.copy_(norm)
        self._finite.fill_(finite)
        skipped = not finite and kind == _NONE
        return {
            "grad_norm": norm,
            "outer_skipped": torch.tensor(int(skipped), dtype=self._seq_no.dtype),
            "weights_seq_no": self._seq_no.clone(),
        }

    def _record(self, kind: int, norm: Tensor, inner: InnerCheck | None) -> None:
        """Write the first failure into the live record (read only once it holds one)."""
        failure = self._failure
        failure.kind.fill_(kind)
        failure.seq_no.copy_(self._seq_no)
        failure.norm.copy_(norm)
        if inner is not None:
            failure.inner_tasks.copy_(inner.tasks)
            failure.num_tasks.fill_(inner.num_tasks)

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


def copy_state(live: OuterState, new: OuterState) -> None:
    """Copy every tensor of `new` into the same place of `live`."""
    if torch.compiler.is_compiling():
        # One copy per tensor: torch.compile folds them into the kernels that produce them
        # (and its lowering of one foreach copy over mixed dtypes and shapes lost values).
        for target, value in zip(tree_tensors(live), tree_tensors(new), strict=True):
            target.copy_(value)
    else:
        foreach_copy_(tree_tensors(live), tree_tensors(new))


def _no_failure(like: Tensor, modules: int) -> Failure:
    def zeros(*shape: int, dtype: torch.dtype = torch.int64) -> Tensor:
        return torch.zeros(shape, dtype=dtype, device=like.device)

    return Failure(zeros(), zeros(), zeros(dtype=like.dtype), zeros(modules), zeros())
