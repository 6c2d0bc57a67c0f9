"""DifferentiableLearner: equivalence with hand-written loops, per-module gradients, unused
parameters, non-finite policies, clipping, learned learning rates and the module left intact."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad

from learners import (
    DifferentiableLearner,
    InnerConfig,
    NonFiniteGradientError,
    init_log_lrs,
    lrs_from_log,
    mse_loss,
    params_from_modules,
)
from learners.inner.optim import AdamState
from learners.transforms import tree_tensors
from tests.helpers.references import reference_mse as _mse
from tests.helpers.tolerances import largest, rounding_tolerance

F64 = torch.float64
# Rounded operations along the longest chain behind one result of these tests: at most 6
# steps (3 minibatches of 2) of about 100 each (the forward pass through the 3-8-2 net, the
# loss over 6 rows, the backward pass, the update): 600 < 1,000.
_OPS = 1_000


def _mlp(obs_dim: int = 3, out_dim: int = 2, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(obs_dim, 8), nn.Tanh(), nn.Linear(8, out_dim)).double()


def _batch(rows: int = 6, obs_dim: int = 3, act_dim: int = 2, seed: int = 1, mid: str = "m"):
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(rows, obs_dim, generator=g, dtype=torch.float64)
    return {mid: {"obs": obs, "actions": torch.randn(rows, act_dim, generator=g, dtype=obs.dtype)}}


def _learner(model: nn.Module | dict, **inner) -> DifferentiableLearner:
    models = model if isinstance(model, dict) else {"m": model}
    return DifferentiableLearner(models, InnerConfig(**inner), dict.fromkeys(models, mse_loss))


def _reference_sgd(model: nn.Module, params: dict, batches: list[dict], lr: float, steps: int):
    """A plain torch.func loop: the behaviour update() must reproduce."""

    def loss_fn(p, columns):
        return _mse(functional_call(model, p, (columns["obs"],)), columns)

    losses = []
    for batch in batches:
        for _ in range(steps):
            g, loss = grad(loss_fn, has_aux=False)(params, batch["m"]), loss_fn(params, batch["m"])
            losses.append(loss)
            params = {k: params[k] - lr * g[k] for k in params}
    return params, torch.stack(losses).mean()


def test_update_over_several_minibatches_matches_a_hand_written_loop():
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    batches = [_batch(seed=s) for s in (1, 2, 3)]
    result = _learner(model, lr=0.1).update(params, iter(batches), steps=2)
    expected, expected_loss = _reference_sgd(model, params["m"], batches, lr=0.1, steps=2)
    atol = rounding_tolerance(F64, magnitude=largest([*expected.values(), expected_loss]), ops=_OPS)
    for name, tensor in expected.items():
        torch.testing.assert_close(result.params["m"][name], tensor, rtol=0, atol=atol)
    # The loss is the mean over all six steps, not the last minibatch's.
    torch.testing.assert_close(result.loss_per_module["m"], expected_loss, rtol=0, atol=atol)
    assert float(result.metrics["m"]["nonfinite"]) == 0.0


def test_update_without_minibatches_is_an_error():
    with pytest.raises(ValueError, match=r"update\(\) received no minibatches"):
        _learner(_mlp()).update(params_from_modules({"m": _mlp()}), iter([]))


@pytest.mark.parametrize(
    ("kind", "make_torch_opt"),
    [
        ("momentum", lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9)),
        ("adam", lambda ps: torch.optim.Adam(ps, lr=0.05, betas=(0.9, 0.999), eps=1e-8)),
    ],
)
def test_inner_optimizers_match_torch_optim(kind, make_torch_opt):
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    learner = _learner(model, lr=0.05, optimizer=kind, eps_root=0.0, first_order=True)
    result = learner.update(params, [_batch(seed=s) for s in range(4)])
    twin = _mlp()
    optimizer = make_torch_opt(list(twin.parameters()))
    for seed in range(4):
        optimizer.zero_grad()
        columns = _batch(seed=seed)["m"]
        _mse(twin(columns["obs"]), columns).backward()
        optimizer.step()
    # torch.optim orders the same arithmetic differently: rounding alone, on parameters larger
    # than the 4 steps' moves (at most lr times a direction of about 1, or 10 for momentum).
    atol = rounding_tolerance(F64, magnitude=largest(twin.parameters()), ops=_OPS)
    for name, p in twin.named_parameters():
        torch.testing.assert_close(result.params["m"][name], p.detach(), rtol=0, atol=atol)


def test_optimizer_state_passes_out_and_back_in():
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    learner = _learner(model, optimizer="adam", lr=0.01)
    batches = [_batch(seed=s) for s in range(4)]
    straight = learner.update(params, batches)
    first = learner.update(params, batches[:2], opt_state=learner.init_opt_state(params))
    second = learner.update(first.params, batches[2:], opt_state=first.opt_state)
    for name, tensor in straight.params["m"].items():
        assert torch.equal(second.params["m"][name], tensor)
    (adam,) = [link for link in second.opt_state["m"] if isinstance(link, AdamState)]
    assert float(adam.step) == 4.0


def test_two_modules_each_get_their_own_gradients():
    # Same architecture, different data: the reference design handed module b module a's
    # gradients. Each module of a joint update must move exactly as it does alone.
    models = {"a": _mlp(seed=0), "b": _mlp(seed=1)}
    params = params_from_modules(models, clone=True)
    batch = {**_batch(seed=2, mid="a"), **_batch(seed=3, mid="b")}
    joint = _learner(models, lr=0.1).update(params, batch)
    for mid in ("a", "b"):
        alone = _learner({mid: models[mid]}, lr=0.1).update({mid: params[mid]}, {mid: batch[mid]})
        magnitude = largest([*alone.params[mid].values(), alone.loss_per_module[mid]])
        atol = rounding_tolerance(F64, magnitude=magnitude, ops=_OPS)
        for name, tensor in alone.params[mid].items():
            torch.testing.assert_close(joint.params[mid][name], tensor, rtol=0, atol=atol)
        torch.testing.assert_close(
            joint.loss_per_module[mid], alone.loss_per_module[mid], rtol=0, atol=atol
        )
    assert not torch.equal(
        joint.params["a"]["0.weight"] - params["a"]["0.weight"],
        joint.params["b"]["0.weight"] - params["b"]["0.weight"],
    )


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 2, dtype=torch.float64)
        self.unused = nn.Parameter(torch.ones(4, dtype=torch.float64))

    def forward(self, obs):
        return self.used(obs)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_an_unused_parameter_gets_no_update_and_no_crash(optimizer):
    model = _WithUnused()
    params = params_from_modules({"m": model}, clone=True)
    result = _learner(model, optimizer=optimizer, lr=0.1).update(params, _batch(), steps=3)
    assert torch.equal(result.params["m"]["unused"], params["m"]["unused"])
    assert not torch.equal(result.params["m"]["used.weight"], params["m"]["used.weight"])


def test_modules_not_updated_pass_through_and_a_batch_without_trainable_modules_fails():
    models = {"a": _mlp(seed=0), "b": _mlp(seed=1)}
    params = params_from_modules(models, clone=True)
    learner = DifferentiableLearner(models, InnerConfig(), {"a": mse_loss}, modules_to_update=["a"])
    batch = {**_batch(mid="a"), **_batch(mid="b")}
    result = learner.update(params, batch)
    assert result.params["b"] is params["b"]
    assert set(result.loss_per_module) == {"a"}
    with pytest.raises(ValueError) as error:
        learner.update(params, _batch(mid="b"))
    assert str(error.value) == (
        "the batch holds modules ['b'] but none of them is updated by this learner "
        "(modules_to_update: ['a'])"
    )


def test_a_minibatch_may_lack_a_module_which_then_is_not_updated_on_that_step():
    models = {"a": _mlp(seed=0), "b": _mlp(seed=1)}
    params = params_from_modules(models, clone=True)
    learner = _learner(models, lr=0.1)
    only_a = _learner({"a": models["a"]}, lr=0.1)
    batches = [{**_batch(seed=1, mid="a"), **_batch(seed=2, mid="b")}, _batch(seed=3, mid="a")]
    result = learner.update(params, batches)
    expected_a = only_a.update({"a": params["a"]}, [{"a": b["a"]} for b in batches])
    atol = rounding_tolerance(F64, magnitude=largest(expected_a.params["a"].values()), ops=_OPS)
    for name, tensor in expected_a.params["a"].items():
        torch.testing.assert_close(result.params["a"][name], tensor, rtol=0, atol=atol)
    assert float(result.metrics["b"]["nonfinite"]) == 0.0


def test_the_modules_own_parameters_and_the_input_params_are_never_changed():
    model = _mlp()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    params = params_from_modules({"m": model})  # the module's own nn.Parameters
    snapshot = {k: v.detach().clone() for k, v in params["m"].items()}
    learner = _learner(model, optimizer="adam", lr=0.1)
    result = learner.update(params, [_batch(seed=s) for s in range(3)], steps=2)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])
    for name, tensor in params["m"].items():
        assert torch.equal(tensor, snapshot[name])
    # Gradients still flow from the updated copies back into the module's parameters.
    result.params["m"]["2.bias"].sum().backward()
    assert model[2].bias.grad is not None


def _nan_batch():
    batch = _batch()
    batch["m"]["obs"][0, 0] = float("nan")
    return batch


def test_nonfinite_error_names_the_module():
    model = _mlp()
    with pytest.raises(NonFiniteGradientError) as error:
        _learner(model).update(
            params_from_modules({"m": model}), [_batch(), _nan_batch(), _batch()]
        )
    assert str(error.value) == (
        "non-finite inner gradient for module 'm': the updated parameters are non-finite; "
        "lower inner.lr, set inner.clip_norm, or choose inner.nonfinite 'skip' or 'zero'"
    )


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adam"])
def test_nonfinite_skip_leaves_params_and_state_bit_identical(optimizer):
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    learner = _learner(model, optimizer=optimizer, nonfinite="skip", clip_norm=1.0)
    warm = learner.update(params, _batch(seed=5))
    skipped = learner.update(warm.params, _nan_batch(), opt_state=warm.opt_state)
    for name, tensor in warm.params["m"].items():
        assert torch.equal(skipped.params["m"][name], tensor)
    # The policy's own record of the step (its norm and verdict) aside, every tensor of the
    # optimizer's state is the one before.
    before, after = warm.opt_state["m"].inner, skipped.opt_state["m"].inner
    assert len(tree_tensors(before)) == len(tree_tensors(after))
    for old, new in zip(tree_tensors(before), tree_tensors(after), strict=True):
        assert torch.equal(new, old)
    assert float(skipped.metrics["m"]["nonfinite"]) == 1.0


class _Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.5, 0.5], dtype=torch.float64))

    def forward(self, obs):
        return obs * self.w


def test_nonfinite_zero_replaces_only_the_nonfinite_entries():
    model = _Scale()
    params = params_from_modules({"m": model}, clone=True)
    obs = torch.tensor([[1.0, float("inf")], [2.0, 1.0]], dtype=torch.float64)
    batch = {"m": {"obs": obs, "actions": torch.zeros(2, 2, dtype=obs.dtype)}}
    result = _learner(model, lr=0.1, nonfinite="zero").update(params, batch)
    # d/dw0 of mean((x0 w0)^2 + (x1 w1)^2) over 4 entries: 2 w0 (1 + 4) / 4 = 1.25; w1's is inf.
    # About 10 rounded operations on values of at most 5 (2 w0 (1 + 4)).
    torch.testing.assert_close(
        result.params["m"]["w"],
        torch.tensor([0.5 - 0.1 * 1.25, 0.5], dtype=F64),
        rtol=0,
        atol=rounding_tolerance(F64, magnitude=5.0, ops=10),
    )
    assert torch.isfinite(result.params["m"]["w"]).all()


def test_clipping_scales_the_step_to_the_global_norm():
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    batch = _batch()
    plain = _learner(model, lr=0.1).update(params, batch)
    clipped = _learner(model, lr=0.1, clip_norm=1e-3).update(params, batch)
    steps = {name: (plain.params["m"][name] - p).detach() for name, p in params["m"].items()}
    norm = float(torch.stack([s.norm() for s in steps.values()]).norm()) / 0.1
    assert norm > 1e-3
    # The steps are differences of parameters, so they carry the parameters' rounding.
    atol = rounding_tolerance(F64, magnitude=largest(params["m"].values()), ops=_OPS)
    for name, p in params["m"].items():
        step_plain = plain.params["m"][name] - p
        step_clipped = clipped.params["m"][name] - p
        torch.testing.assert_close(
            step_clipped, step_plain * 1e-3 / (norm + 1e-6), rtol=0, atol=atol
        )


@pytest.mark.parametrize("mode", ["scalar", "tensor", "element"])
def test_learned_lrs_equal_to_lr_give_the_plain_update(mode):
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    log_lrs = init_log_lrs(params, mode, 0.05, ["m"])
    expected_keys = ["m"] if mode == "scalar" else [f"m/{n}" for n in params["m"]]
    assert list(log_lrs) == expected_keys
    if mode == "element":
        assert all(log_lrs[f"m/{n}"].shape == p.shape for n, p in params["m"].items())
    lrs = lrs_from_log(log_lrs, params, mode)
    learner = _learner(model, lr=0.05)
    with_lrs = learner.update(params, _batch(), lrs=lrs)
    plain = learner.update(params, _batch())
    atol = rounding_tolerance(F64, magnitude=largest(plain.params["m"].values()), ops=_OPS)
    for name, tensor in plain.params["m"].items():
        torch.testing.assert_close(with_lrs.params["m"][name], tensor, rtol=0, atol=atol)


def test_second_order_keeps_the_graph_and_first_order_detaches_the_gradient():
    model = _mlp()
    params = params_from_modules({"m": model}, clone=True)
    weight = params["m"]["0.weight"]
    for first_order, expected_identity in ((False, False), (True, True)):
        result = _learner(model, lr=0.1, first_order=first_order).update(params, _batch())
        (jac,) = torch.autograd.grad(result.params["m"]["0.weight"].sum(), weight)
        assert torch.equal(jac, torch.ones_like(jac)) is expected_identity


def test_batches_without_obs_are_refused_with_the_columns_found():
    model = _mlp()
    with pytest.raises(ValueError) as error:
        _learner(model).update(params_from_modules({"m": model}), {"m": {"actions": torch.ones(2)}})
    assert str(error.value) == "module 'm': the batch has columns ['actions'], expected 'obs'"


def test_bad_steps_and_incomplete_learning_rates_are_refused():
    model = _mlp()
    params = params_from_modules({"m": model})
    learner = _learner(model)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        learner.update(params, _batch(), steps=0)
    with pytest.raises(ValueError) as error:
        learner.update(params, _batch(), lrs={"other": {}})
    assert str(error.value) == "lrs hold no learning rates for module 'm': ['other']"


def test_construction_errors_name_the_modules():
    models = {"a": _mlp(), "b": _mlp()}
    with pytest.raises(ValueError) as error:
        DifferentiableLearner(models, InnerConfig(), {"a": mse_loss})
    assert str(error.value) == "no loss given for modules ['b']; losses cover ['a']"
    with pytest.raises(ValueError) as error:
        DifferentiableLearner(models, InnerConfig(), {"a": mse_loss}, modules_to_update=["c"])
    assert str(error.value) == (
        "modules_to_update ['c'] must name at least one of the modules ['a', 'b']; unknown: ['c']"
    )
