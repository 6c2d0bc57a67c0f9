"""Gradient transformations: pure `init`/`update` pairs with NamedTuple states, composed by
`chain` (STYLE.md 13), shared by the inner (differentiable) optimizer and the outer update.

A link maps gradient-like values to gradient-like values, one tensor per parameter in a fixed
order: `update(updates, state, inputs) -> (updates, state)`. Nothing is written in place, so
a chain can be differentiated through (second-order MAML), vmapped over tasks and compiled.
The chain's output is what the parameters move down by: `descend(params, steps, lr=...)`.

Written once here for both optimizers: the global norm, clipping by it, the non-finite
policies (`skip_nonfinite`, `zero_nonfinite`, which wrap the rest of a chain) and
`keep_where`, which keeps every value a step must not change (parameters or state) exactly.
`foreach=True` selects torch's fused list kernels (the outer update, eager); the inner update
runs under vmap, which they do not support, so it uses per-tensor ops.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor

from learners.torch_compat import foreach_mul, foreach_norm, foreach_sub

Tensors = list[Tensor]
# Added to the norm before dividing, as torch.nn.utils.clip_grad_norm_ does.
_CLIP_EPS = 1e-6


class StepInputs(NamedTuple):
    """What a link may read besides the updates and its own state."""

    params: Sequence[Tensor]
    """The parameters the updates are for, in the same order."""
    rates: Sequence[Tensor] | None = None
    """Learning rates given with this step, one per parameter (Meta-SGD); None: the link's."""
    norm: Tensor | None = None
    """The global norm of the updates the link receives, when the link before it measured
    it (`chain` hands it to its first link only)."""
    allowed: Tensor | None = None
    """0-d bool: False makes `skip_nonfinite` leave everything as it was (None: allowed)."""


class Transform(NamedTuple):
    """A gradient transformation: a pair of pure functions."""

    init: Callable[[Sequence[Tensor]], Any]
    """The initial state for these parameters."""
    update: Callable[[Tensors, Any, StepInputs], tuple[Tensors, Any]]
    """The transformed updates and the next state; the inputs are left untouched."""


class EmptyState(NamedTuple):
    """The state of a link that keeps none."""


class NonFiniteState(NamedTuple):
    """The state of a non-finite policy: the wrapped rule's, and what the last step met."""

    inner: Any
    """The wrapped rule's state."""
    norm: Tensor
    """Global norm of the last step's incoming updates (NaN or inf when non-finite), without
    autograd history: a record, never differentiated."""
    finite: Tensor
    """Whether that norm was finite (0-d bool)."""


_EMPTY = EmptyState()


def chain(*links: Transform) -> Transform:
    """The links applied one after the other; the state is the tuple of their states."""

    def init(params: Sequence[Tensor]) -> tuple:
        return tuple(link.init(params) for link in links)

    def update(updates: Tensors, state: tuple, inputs: StepInputs) -> tuple[Tensors, tuple]:
        states = []
        for link, link_state in zip(links, state, strict=True):
            updates, link_state = link.update(updates, link_state, inputs)
            states.append(link_state)
            if inputs.norm is not None:  # it described the chain's input, not this output
                inputs = inputs._replace(norm=None)
        return updates, tuple(states)

    return Transform(init, update)


def stateless(function: Callable[[Tensors, StepInputs], Tensors]) -> Transform:
    """A link from a function of the updates and the inputs."""

    def update(updates: Tensors, state: EmptyState, inputs: StepInputs) -> tuple[Tensors, Any]:
        return function(updates, inputs), state

    return Transform(lambda params: _EMPTY, update)


def global_norm(
    tensors: Sequence[Tensor] | Mapping[str, Tensor], *, foreach: bool = False
) -> Tensor:
    """The L2 norm of all tensors together (non-finite if any entry is)."""
    if isinstance(tensors, Mapping):
        tensors = list(tensors.values())
    if torch.compiler.is_compiling():
        # torch.compile lowers neither vector norms under vmap nor the foreach norm to fused
        # code; a sum of squares is one fused reduction.
        return torch.sqrt(torch.stack([t.square().sum() for t in tensors]).sum())
    # Per-tensor norms under vmap (the foreach norm has none), and on CPU they are as fast.
    norms = foreach_norm(tensors) if foreach else [torch.linalg.vector_norm(t) for t in tensors]
    return torch.linalg.vector_norm(torch.stack(norms))


def clip_by_global_norm(max_norm: float, *, foreach: bool = False) -> Transform:
    """Updates scaled down so that their global norm is at most `max_norm`."""

    def clip(updates: Tensors, inputs: StepInputs) -> Tensors:
        norm = inputs.norm if inputs.norm is not None else global_norm(updates, foreach=foreach)
        scale = torch.clamp(max_norm / (norm + _CLIP_EPS), max=1.0)
        return foreach_mul(updates, scale) if foreach else [u * scale for u in updates]

    return stateless(clip)


def skip_nonfinite(rule: Transform, *, foreach: bool = False, differentiated: bool) -> Transform:
    """`rule` on the steps whose incoming updates are finite and `inputs.allowed`; any other
    step returns zero updates and keeps `rule`'s state exactly (`keep_where`), so that
    `descend` leaves the parameters exactly as they were.

    `differentiated`: the step is differentiated through (the inner update). Then a
    non-finite step's updates are zeroed before `rule` sees them: in the branch the selection
    discards, a NaN would still reach the meta-gradient as 0 times NaN. Otherwise the norm
    measured here is handed to `rule`'s first link (a clip need not measure it again).
    """

    def init(params: Sequence[Tensor]) -> NonFiniteState:
        return _nonfinite_state(rule.init(params), params)

    def update(
        updates: Tensors, state: NonFiniteState, inputs: StepInputs
    ) -> tuple[Tensors, NonFiniteState]:
        norm = global_norm(updates, foreach=foreach)
        finite = torch.isfinite(norm)
        keep = finite if inputs.allowed is None else finite & inputs.allowed
        zero = norm.new_zeros(())  # one tensor: a Python 0.0 would make one per where
        if differentiated:
            updates = [torch.where(finite, u, zero) for u in updates]
            # Not handed on: its derivative at a non-finite step is NaN even where the
            # selection discards it; a clip measures the zeroed updates again.
            inputs = inputs._replace(norm=None)
        else:
            inputs = inputs._replace(norm=norm)
        steps, inner = rule.update(updates, state.inner, inputs)
        steps = [torch.where(keep, s, zero) for s in steps]
        kept = keep_where(keep, inner, state.inner)
        return steps, NonFiniteState(kept, norm.detach() if differentiated else norm, finite)

    return Transform(init, update)


def zero_nonfinite(rule: Transform, *, foreach: bool = False) -> Transform:
    """`rule` on the updates with every NaN and ±inf entry replaced by 0 (never by the
    largest float)."""

    def init(params: Sequence[Tensor]) -> NonFiniteState:
        return _nonfinite_state(rule.init(params), params)

    def update(
        updates: Tensors, state: NonFiniteState, inputs: StepInputs
    ) -> tuple[Tensors, NonFiniteState]:
        norm = global_norm(updates, foreach=foreach)
        zeroed = [torch.nan_to_num(u, nan=0.0, posinf=0.0, neginf=0.0) for u in updates]
        steps, inner = rule.update(zeroed, state.inner, inputs)
        return steps, NonFiniteState(inner, norm.detach(), torch.isfinite(norm))

    return Transform(init, update)


def descend(
    params: Sequence[Tensor], steps: Sequence[Tensor], *, lr: float = 1.0, foreach: bool = False
) -> Tensors:
    """The parameters moved down by `lr` times a chain's output (`params - lr * steps`, a new
    list; one kernel a tensor, the scaling fused into the subtraction).

    A zero step leaves a parameter exactly as it was, -0.0 included."""
    if foreach:
        if lr != 1.0:
            raise ValueError("descend(foreach=True) takes steps already scaled (lr=1.0)")
        return foreach_sub(list(params), list(steps))
    if lr == 1.0:
        return [p - s for p, s in zip(params, steps, strict=True)]
    return [torch.add(p, s, alpha=-lr) for p, s in zip(params, steps, strict=True)]


def keep_where(condition: Tensor, new: Any, old: Any) -> Any:
    """`new` where the 0-d `condition` holds, else `old`, exactly (a NaN in the branch not
    taken does not leak): a tensor, a list of tensors, or NamedTuples and tuples of them."""
    if isinstance(new, Tensor):
        return torch.where(condition, new, old)
    if isinstance(new, list):
        return [torch.where(condition, n, o) for n, o in zip(new, old, strict=True)]
    items = [keep_where(condition, n, o) for n, o in zip(new, old, strict=True)]
    return type(new)(*items) if hasattr(new, "_fields") else tuple(items)


def tree_tensors(state: Any) -> Tensors:
    """Every tensor of a state (a tensor, lists of tensors, NamedTuples and tuples of them),
    in order."""
    if isinstance(state, Tensor):
        return [state]
    if isinstance(state, list):  # a list holds tensors only (one per parameter)
        return state
    return [t for item in state for t in tree_tensors(item)]


def _nonfinite_state(inner: Any, params: Sequence[Tensor]) -> NonFiniteState:
    first = params[0]
    norm = torch.zeros((), dtype=first.dtype, device=first.device)
    return NonFiniteState(inner, norm, torch.ones((), dtype=torch.bool, device=first.device))
