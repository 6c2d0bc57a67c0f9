"""Losses and models: values against torch references, clear errors, user losses by import
path, reproducible model construction, and every head trained by the meta-learner."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from learners import (
    MetaLearner,
    ModuleCall,
    ModuleSpec,
    build_models,
    cross_entropy_loss,
    gaussian_nll_loss,
    mse_loss,
    resolve_loss,
)
from learners.losses import untied_modules
from tests.helpers.tolerances import largest, rounding_tolerance


def user_loss(call, batch):
    """An L1 loss, referenced from config as '<this module>:user_loss'."""
    outputs = call(call.module_id, batch["obs"])
    return (outputs.reshape(batch["actions"].shape) - batch["actions"]).abs().mean()


class _Fixed(nn.Module):
    """A module whose forward returns the outputs it was built with, whatever the input."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs

    def forward(self, obs):
        return self.outputs


def _loss(loss, outputs, columns):
    """`loss` of a module 'm' that outputs `outputs`, on `columns` plus a dummy `obs`."""
    rows = columns["actions"].shape[0]
    call = ModuleCall("m", {"m": _Fixed(outputs)}, {"m": {}}, {})
    return loss(call, {"obs": torch.zeros(rows, 1), **columns})


def test_mse_matches_torch_and_accepts_flat_targets():
    outputs, target = torch.randn(5, 1), torch.randn(5)
    assert torch.equal(
        _loss(mse_loss, outputs, {"actions": target}), F.mse_loss(outputs[:, 0], target)
    )
    gaussian = {"mean": outputs, "log_std": torch.zeros(5, 1)}
    assert torch.equal(
        _loss(mse_loss, gaussian, {"actions": target}),
        _loss(mse_loss, outputs, {"actions": target}),
    )
    with pytest.raises(ValueError) as error:
        _loss(mse_loss, torch.randn(5, 2), {"actions": target})
    assert str(error.value) == (
        "mse: model output shape (5, 2) does not match actions shape (5,); "
        "check the module's action_dim"
    )


def test_gaussian_nll_is_the_normal_log_likelihood():
    mean, log_std, actions = torch.randn(4, 3), torch.randn(4, 3) * 0.3, torch.randn(4, 3)
    per_dim = torch.distributions.Normal(mean, log_std.exp()).log_prob(actions)
    expected = -per_dim.sum(-1).mean()
    loss = _loss(gaussian_nll_loss, {"mean": mean, "log_std": log_std}, {"actions": actions})
    # Two float32 formulas of about 10 rounded operations per entry (exp and log within an ulp
    # or two), a sum of 3 and a mean of 4: under 20 operations on at most a row's sum.
    atol = rounding_tolerance(torch.float32, magnitude=largest([per_dim.abs().sum(-1)]), ops=20)
    torch.testing.assert_close(loss, expected, rtol=0, atol=atol)
    with pytest.raises(
        TypeError, match=r"gaussian_nll expects the model to return \{'mean', 'log_std'\}"
    ):
        _loss(gaussian_nll_loss, mean, {"actions": actions})


def test_cross_entropy_needs_int64_class_indices():
    logits, actions = torch.randn(6, 4), torch.randint(0, 4, (6,))
    assert torch.equal(
        _loss(cross_entropy_loss, logits, {"actions": actions}), F.cross_entropy(logits, actions)
    )
    with pytest.raises(TypeError) as error:
        _loss(cross_entropy_loss, logits, {"actions": actions.float()})
    assert str(error.value) == (
        "cross_entropy expects int64 actions (class indices), got torch.float32; "
        "discrete datasets store actions as int64"
    )


def test_losses_resolve_by_name_or_import_path():
    assert resolve_loss("mse") is mse_loss
    assert resolve_loss(f"{__name__}:user_loss") is user_loss
    with pytest.raises(
        ValueError, match=r"loss 'no_such_pkg\.x:f': cannot import module 'no_such_pkg\.x'"
    ):
        resolve_loss("no_such_pkg.x:f")
    with pytest.raises(
        ValueError, match=rf"loss '{__name__}:nope': module '{__name__}' has no function 'nope'"
    ):
        resolve_loss(f"{__name__}:nope")
    with pytest.raises(ValueError, match="unknown loss 'huber'"):
        resolve_loss("huber")


def test_models_are_reproducible_from_the_seed_and_leave_the_global_rng_alone():
    specs = {"a": ModuleSpec(obs_dim=3, action_dim=2), "b": ModuleSpec(obs_dim=3, action_dim=2)}
    rng_before = torch.get_rng_state()
    first, second = build_models(specs, seed=7), build_models(specs, seed=7)
    assert torch.equal(torch.get_rng_state(), rng_before)
    for mid in specs:
        for (name, p), q in zip(
            first[mid].named_parameters(), second[mid].parameters(), strict=True
        ):
            assert torch.equal(p, q), name
    assert not torch.equal(first["a"].layers[0].weight, first["b"].layers[0].weight)


def test_heads_produce_the_documented_outputs():
    specs = {
        "det": ModuleSpec(obs_dim=3, action_dim=2),
        "cat": ModuleSpec(
            obs_dim=3, action_dim=5, model={"head": "categorical"}, loss="cross_entropy"
        ),
        "gau": ModuleSpec(
            obs_dim=3,
            action_dim=2,
            model={"head": "gaussian", "log_std_init": -9.0},
            loss="gaussian_nll",
        ),
    }
    models = build_models(specs, seed=0)
    obs = torch.randn(4, 3)
    assert models["det"](obs).shape == (4, 2)
    assert models["cat"](obs).shape == (4, 5)
    out = models["gau"](obs)
    assert out["mean"].shape == out["log_std"].shape == (4, 2)
    assert float(out["log_std"].detach().min()) == -5.0  # clamped to LOG_STD_BOUNDS


@pytest.mark.parametrize(
    ("spec", "actions"),
    [
        ({"action_dim": 3, "model": {"head": "categorical"}, "loss": "cross_entropy"}, "discrete"),
        ({"action_dim": 2, "model": {"head": "gaussian"}, "loss": "gaussian_nll"}, "continuous"),
        ({"action_dim": 2, "model": {"head": "gaussian"}, "loss": "mse"}, "continuous"),
        ({"action_dim": 2, "loss": f"{__name__}:user_loss"}, "continuous"),
    ],
)
@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_every_head_and_loss_meta_trains(spec, actions, vectorize):
    config = {
        "modules": {"bc": {"obs_dim": 4, **spec}},
        "vectorize": vectorize,
        "inner": {"lr": 0.1},
    }
    learner = MetaLearner(config)
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(3, 16, 2, 2, generator=g)  # [tasks, rows, *obs_shape]: flattened per row
    if actions == "discrete":
        target = (obs.sum((-1, -2)) > 0).long()
    else:
        target = obs.reshape(3, 16, 4)[..., :2]
    part = {"bc": {"obs": obs, "actions": target}}
    meta_batch = {"support": part, "query": part}
    losses = [float(learner.step(meta_batch)["query_loss"]) for _ in range(20)]
    assert losses[-1] < losses[0]
    curve = learner.evaluate(meta_batch, steps=(0, 1))
    assert curve[1] < curve[0]


class _Tied(nn.Module):
    """Two layers sharing one weight: one tensor reachable by two names."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(2, 2, bias=False)
        self.second = nn.Linear(2, 2, bias=False)
        self.second.weight = self.first.weight

    def forward(self, obs):
        return self.second(torch.relu(self.first(obs)))


def test_only_modules_without_shared_tensors_are_called_untied():
    models = {"tied": _Tied(), "plain": nn.Linear(2, 1)}
    assert untied_modules(models) == frozenset({"plain"})


def test_a_tied_weight_given_once_reaches_both_of_its_names():
    model = _Tied()
    weight = torch.randn(2, 2)
    params = {"tied": {"first.weight": weight}}
    obs = torch.randn(3, 2)
    call = ModuleCall("tied", {"tied": model}, params, {}, untied=untied_modules({"tied": model}))
    expected = torch.relu(obs @ weight.T) @ weight.T
    assert torch.equal(call("tied", obs), expected)
