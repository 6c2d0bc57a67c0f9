"""The outer update against `torch.optim` (Adam, SGD with momentum, weight decay, per-group
learning rates, clipping), its state in the optimizer's own format, and the non-finite
policies: both forms, the pure `outer_update` (compiled steps, GPUs: recorded without a device
sync) and the in-place one `OuterStep.apply` runs on the CPU."""

from __future__ import annotations

import copy

import pytest
import torch

from learners import OuterConfig
from learners.inner.differentiable import NonFiniteGradientError
from learners.meta.outer_step import InnerCheck, OuterRule, OuterStep, outer_update
from tests.helpers.tolerances import largest, trajectory_tolerance

_SHAPES = [(5, 3), (5,), (2, 5), (2,)]
_STEPS = 4
# Rounded operations behind one updated entry, both computations alike: clipping (a norm of
# at most 15 squares, a quotient, a product), the moments (2 each), the bias corrections, the
# square root, the quotient and the update: under 40.
_OPS = 40


def _leaves(dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=dtype).requires_grad_() for s in _SHAPES]


def _grads(dtype: torch.dtype, step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(s, generator=g, dtype=dtype) * 3 for s in _SHAPES]


def _optimizer(config: OuterConfig, leaves: list[torch.Tensor]) -> torch.optim.Optimizer:
    # Two param groups with their own learning rates, as per-module outer rates make them.
    groups = [{"params": leaves[:2], "lr": config.lr}, {"params": leaves[2:], "lr": config.lr / 3}]
    if config.optimizer == "adam":
        return torch.optim.Adam(groups, betas=config.betas, weight_decay=config.weight_decay)
    return torch.optim.SGD(groups, momentum=config.momentum, weight_decay=config.weight_decay)


def _pure(outer: OuterStep, grads: list[torch.Tensor], inner: InnerCheck | None) -> dict:
    """`outer_update` on the live state, written back: what the compiled step runs."""
    with torch.no_grad():
        live = outer.state()
        new, metrics = outer_update(outer.rule, live, grads, inner)
        outer.write(live, new)
    return metrics


def _in_place(outer: OuterStep, grads: list[torch.Tensor], inner: InnerCheck | None) -> dict:
    return outer.apply(grads, inner)


_FORMS = pytest.mark.parametrize("apply", [_pure, _in_place], ids=["pure", "in-place"])


def _functional(config: OuterConfig, dtype: torch.dtype) -> tuple[OuterStep, list[torch.Tensor]]:
    leaves = _leaves(dtype)
    optimizer = _optimizer(config, leaves)
    return OuterStep(OuterRule.of(config, optimizer, leaves), optimizer, leaves, ["m"]), leaves


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "config",
    [
        OuterConfig(lr=0.01, weight_decay=0.1),
        OuterConfig(lr=0.01, clip_norm=1.0),
        OuterConfig(optimizer="sgd", lr=0.05, momentum=0.9, weight_decay=0.1),
        OuterConfig(optimizer="sgd", lr=0.05, clip_norm=1.0),
    ],
    ids=["adam-decay", "adam-clip", "sgd-momentum-decay", "sgd-clip"],
)
@_FORMS
def test_the_functional_update_equals_torch_optim(config, dtype, apply):
    outer, leaves = _functional(config, dtype)
    reference = _leaves(dtype)
    optimizer = _optimizer(config, reference)
    for step in range(_STEPS):
        grads = _grads(dtype, step)
        metrics = apply(outer, grads, None)
        for leaf, grad in zip(reference, grads, strict=True):
            leaf.grad = grad.clone()
        if config.clip_norm is not None:
            norm = torch.nn.utils.clip_grad_norm_(reference, config.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm(grads)
        optimizer.step()
        torch.testing.assert_close(metrics["grad_norm"], norm, rtol=0, atol=0)
    # Adam moves an entry by at most its lr per step; SGD by lr times the (clipped) gradient,
    # summed with momentum: at most lr * |g| / (1 - momentum).
    size = config.lr * (1 if config.optimizer == "adam" else largest(grads) / (1 - config.momentum))
    atol = trajectory_tolerance(
        dtype, steps=_STEPS, step_size=size, params_magnitude=largest(reference), ops=_OPS
    )
    # The in-place form is torch's own arithmetic in torch's order: equal to the last bit.
    if apply is _in_place:
        atol = 0
    for mine, theirs in zip(leaves, reference, strict=True):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=0, atol=atol)
    assert outer.weights_seq_no == _STEPS
    # One state format: torch's own optimizer continues from the functional one's state.
    ours = outer._optimizer.state_dict()
    assert ours["state"].keys() == optimizer.state_dict()["state"].keys()
    for index, slots in optimizer.state_dict()["state"].items():
        assert ours["state"][index].keys() == slots.keys()
        for name, value in slots.items():
            mine = ours["state"][index][name]
            assert (mine.dtype, mine.device, mine.shape) == (value.dtype, value.device, value.shape)


@_FORMS
def test_a_state_written_by_torch_optim_continues_functionally(apply):
    config = OuterConfig(lr=0.01)
    outer, leaves = _functional(config, torch.float64)
    reference = _leaves(torch.float64)
    optimizer = _optimizer(config, reference)
    for step in range(_STEPS):
        grads = _grads(torch.float64, step)
        for leaf, grad in zip(reference, grads, strict=True):
            leaf.grad = grad.clone()
        optimizer.step()
        if step < 2:  # torch steps twice, then the functional rule takes over its state
            with torch.no_grad():
                for leaf, theirs in zip(leaves, reference, strict=True):
                    leaf.copy_(theirs)
            outer._optimizer.load_state_dict(copy.deepcopy(optimizer.state_dict()))
            outer.reset(step + 1)
        else:
            apply(outer, grads, None)
    atol = trajectory_tolerance(
        torch.float64, steps=2, step_size=0.01, params_magnitude=largest(reference), ops=_OPS
    )
    for mine, theirs in zip(leaves, reference, strict=True):
        torch.testing.assert_close(mine.detach(), theirs.detach(), rtol=0, atol=atol)
    assert outer.weights_seq_no == _STEPS


@_FORMS
def test_updates_after_the_optimizer_loads_a_state_go_into_the_loaded_tensors(apply):
    outer, leaves = _functional(OuterConfig(lr=0.01), torch.float64)
    apply(outer, _grads(torch.float64, 0), None)
    saved = copy.deepcopy(outer._optimizer.state_dict())
    values = [leaf.detach().clone() for leaf in leaves]
    apply(outer, _grads(torch.float64, 1), None)
    expected = copy.deepcopy(outer._optimizer.state_dict())
    with torch.no_grad():
        for leaf, value in zip(leaves, values, strict=True):
            leaf.copy_(value)
    outer._optimizer.load_state_dict(saved)  # the live state is read again, reset or not
    apply(outer, _grads(torch.float64, 1), None)
    mine = outer._optimizer.state_dict()["state"]
    for index, theirs in expected["state"].items():
        for name, value in theirs.items():
            assert torch.equal(mine[index][name], value), (index, name)


def _nan_grads(step: int) -> list[torch.Tensor]:
    grads = _grads(torch.float64, step)
    grads[2][1, 3] = float("nan")
    return grads


@_FORMS
def test_a_nonfinite_meta_gradient_is_skipped_or_halts_until_the_check(apply):
    skipping, leaves = _functional(OuterConfig(nonfinite="skip"), torch.float64)
    apply(skipping, _grads(torch.float64, 0), None)
    before = [leaf.detach().clone() for leaf in leaves]
    metrics = apply(skipping, _nan_grads(1), None)
    assert int(metrics["outer_skipped"]) == 1 and skipping.weights_seq_no == 1
    assert all(torch.equal(leaf, b) for leaf, b in zip(leaves, before, strict=True))
    skipping.check_finite()
    metrics = apply(skipping, _grads(torch.float64, 2), None)
    assert int(metrics["outer_skipped"]) == 0 and skipping.weights_seq_no == 2

    halting, leaves = _functional(OuterConfig(), torch.float64)
    apply(halting, _grads(torch.float64, 0), None)
    before = [leaf.detach().clone() for leaf in leaves]
    for step in (1, 2):  # the non-finite step, then one that would be fine
        metrics = apply(halting, _nan_grads(1) if step == 1 else _grads(torch.float64, 2), None)
        assert int(metrics["outer_skipped"]) == 0
    assert halting.weights_seq_no == 1
    assert all(torch.equal(leaf, b) for leaf, b in zip(leaves, before, strict=True))
    with pytest.raises(NonFiniteGradientError) as error:
        halting.check_finite()
    assert str(error.value) == (
        "non-finite meta-gradient (norm nan) at weights_seq_no 1; set outer.clip_norm, lower "
        "the learning rates, or choose outer.nonfinite='skip'"
    )
    halting.reset(1)
    halting.check_finite()


@_FORMS
def test_an_inner_failure_halts_the_update_whatever_the_meta_gradient(apply):
    outer, leaves = _functional(OuterConfig(), torch.float64)
    before = [leaf.detach().clone() for leaf in leaves]
    inner = InnerCheck(torch.tensor([2]), num_tasks=5)
    apply(outer, _grads(torch.float64, 0), inner)
    assert outer.weights_seq_no == 0
    assert all(torch.equal(leaf, b) for leaf, b in zip(leaves, before, strict=True))
    with pytest.raises(NonFiniteGradientError) as error:
        outer.check_finite()
    assert str(error.value).startswith(
        "non-finite inner gradient for module 'm': met in 2 of 5 tasks at weights_seq_no 0;"
    )
