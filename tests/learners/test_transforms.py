"""The shared links of learners/transforms.py: a chain threads its links' states, the
non-finite policies keep or repair a step exactly, clipping agrees between the fused and the
per-tensor kernels, and a skipped step leaves a finite second-order gradient."""

from __future__ import annotations

import pytest
import torch

from learners.inner.optim import MomentumState, scale_by_learning_rate, scale_by_momentum
from learners.transforms import (
    StepInputs,
    chain,
    clip_by_global_norm,
    descend,
    global_norm,
    keep_where,
    skip_nonfinite,
    tree_tensors,
    zero_nonfinite,
)

F64 = torch.float64


def _params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 2, generator=g, dtype=F64), torch.tensor([-0.0, 1.5], dtype=F64)]


def _grads(scale: float = 1.0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(3, 2, generator=g, dtype=F64) * scale, torch.tensor([2.0, -1.0], dtype=F64)]


def test_a_chain_applies_its_links_in_order_and_threads_their_states():
    rule = chain(scale_by_momentum(0.5), scale_by_learning_rate(0.1))
    params, state = _params(), None
    state = rule.init(params)
    velocity = [torch.zeros_like(p) for p in params]
    for _ in range(3):
        steps, state = rule.update(_grads(), state, StepInputs(params))
        velocity = [g + 0.5 * v for g, v in zip(_grads(), velocity, strict=True)]
        for step, v in zip(steps, velocity, strict=True):
            assert torch.equal(step, v * 0.1)
        assert isinstance(state[0], MomentumState)
        for kept, v in zip(state[0].velocity, velocity, strict=True):
            assert torch.equal(kept, v)
    rates = [torch.full_like(p, 0.2) for p in params]
    steps, _ = rule.update(_grads(), state, StepInputs(params, rates))
    expected = [0.2 * (g + 0.5 * v) for g, v in zip(_grads(), velocity, strict=True)]
    assert all(torch.equal(s, e) for s, e in zip(steps, expected, strict=True))


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("blocked", ["nonfinite", "not allowed"])
def test_a_skipped_step_leaves_parameters_and_state_bit_identical(foreach, blocked):
    rule = skip_nonfinite(
        chain(scale_by_momentum(0.9), scale_by_learning_rate(0.1)),
        foreach=foreach,
        differentiated=not foreach,
    )
    params = _params()
    state = rule.init(params)
    _, state = rule.update(_grads(), state, StepInputs(params))  # a momentum to keep
    grads, allowed = _grads(), None
    if blocked == "nonfinite":
        grads[0][1, 1] = float("nan")
    else:
        allowed = torch.tensor(False)
    steps, new = rule.update(grads, state, StepInputs(params, allowed=allowed))
    moved = descend(params, steps, foreach=foreach)
    for before, after in zip(params, moved, strict=True):
        # -0.0 stays -0.0: compared bit by bit, not by value.
        assert torch.equal(before.view(torch.int64), after.view(torch.int64))
    for before, after in zip(tree_tensors(state.inner), tree_tensors(new.inner), strict=True):
        assert torch.equal(before, after)
    assert bool(new.finite) is (blocked != "nonfinite")


def test_zeroing_replaces_only_the_nonfinite_entries_and_records_the_step():
    rule = zero_nonfinite(scale_by_learning_rate(1.0))
    params = _params()
    grads = [torch.tensor([[1.0, float("inf")], [float("nan"), -2.0]], dtype=F64)]
    steps, state = rule.update(grads, rule.init(params), StepInputs(params))
    assert torch.equal(steps[0], torch.tensor([[1.0, 0.0], [0.0, -2.0]], dtype=F64))
    assert not bool(state.finite) and not torch.isfinite(state.norm)


def test_clipping_agrees_between_kernels_and_uses_a_measured_norm():
    params, grads = _params(), _grads(scale=10.0)
    norm = global_norm(grads)
    assert torch.equal(norm, global_norm(grads, foreach=True))
    fused, _ = clip_by_global_norm(1.0, foreach=True).update(grads, (), StepInputs(params))
    single, _ = clip_by_global_norm(1.0).update(grads, (), StepInputs(params))
    for a, b in zip(fused, single, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-15)
    torch.testing.assert_close(global_norm(single), torch.tensor(1.0, dtype=F64))
    # A norm measured by the link before is used as it is (here: twice the true one).
    halved, _ = clip_by_global_norm(norm.item()).update(
        grads, (), StepInputs(params, norm=2 * norm)
    )
    torch.testing.assert_close(global_norm(halved), norm / 2)


@pytest.mark.parametrize("differentiated", [True, False])
def test_a_skipped_step_differentiated_twice_gives_a_finite_gradient(differentiated):
    # d(new params)/d(params) through a skipped step is the identity. Only a rule built to be
    # differentiated keeps it so: otherwise the clip's norm of the non-finite gradient sits in
    # the branch the selection discards, and its derivative there, 0 times NaN, is NaN.
    rule = skip_nonfinite(
        chain(clip_by_global_norm(1.0), scale_by_learning_rate(0.1)),
        differentiated=differentiated,
    )
    x = torch.tensor([1e308, 2.0], dtype=F64, requires_grad=True)
    (g,) = torch.autograd.grad((5 * x.square()).sum(), x, create_graph=True)
    assert torch.isinf(g[0])  # 10 x overflows; its derivative, 10, does not
    steps, _ = rule.update([g], rule.init([x]), StepInputs([x]))
    (new,) = descend([x], steps)
    (jac,) = torch.autograd.grad(new.sum(), x)
    if differentiated:
        assert torch.equal(jac, torch.ones_like(jac))
    else:
        assert torch.isnan(jac).all()


def test_keep_where_selects_whole_states_without_leaking_nan():
    old = MomentumState([torch.tensor([1.0, 2.0])])
    new = MomentumState([torch.tensor([float("nan"), 3.0])])
    kept = keep_where(torch.tensor(False), (new, torch.tensor(5.0)), (old, torch.tensor(4.0)))
    assert isinstance(kept[0], MomentumState)
    assert torch.equal(kept[0].velocity[0], old.velocity[0]) and float(kept[1]) == 4.0


def test_descending_by_a_float_rate_fuses_the_scaling_exactly():
    params, steps = _params(), _grads()
    params[0][0, 0] = -0.0
    steps[0][0, 0] = 0.0
    moved = descend(params, steps, lr=0.1)
    for p, s, m in zip(params, steps, moved, strict=True):
        # what torch.optim.SGD computes (p.add(grad, alpha=-lr)), bit for bit
        assert torch.equal(m, p.add(s, alpha=-0.1))
    assert torch.equal(moved[0][0, 0].view(torch.int64), params[0][0, 0].view(torch.int64))
    with pytest.raises(ValueError, match=r"descend\(foreach=True\) takes steps already scaled"):
        descend(params, steps, lr=0.1, foreach=True)


def test_without_rates_a_rate_free_link_passes_directions_through():
    params, grads = _params(), _grads()
    steps, _ = scale_by_learning_rate(None).update(grads, (), StepInputs(params))
    assert all(s is g for s, g in zip(steps, grads, strict=True))
    rates = [torch.full_like(p, 0.5) for p in params]
    steps, _ = scale_by_learning_rate(None).update(grads, (), StepInputs(params, rates))
    assert all(torch.equal(s, 0.5 * g) for s, g in zip(steps, grads, strict=True))
