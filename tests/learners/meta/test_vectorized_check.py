"""Vmapped meta-gradients against the per-task loop: a layer known to batch wrongly is refused
from the config, one no list knows is caught by the self-check on the first meta-batch, and
right networks pass without the check changing what training does."""

from __future__ import annotations

import re

import pytest
import torch

from learners import MetaConfig, MetaLearner
from learners.meta.vectorized_check import (
    VectorizedGradientError,
    check_vectorized_gradients,
    refuse_wrong_batching,
    tolerance,
)
from learners.models.factory import build_models
from learners.training.loop import run_meta_training

NETS = "tests.learners.models.factory_nets"
WAYS_OUT = (
    "set learners.vectorize: loop, use a first-order algorithm (learners.algorithm: fomaml), "
    "or write the layer norm from mean and var"
)


def _config(net: str, **overrides: object) -> MetaConfig:
    module = {"obs_dim": 2, "action_dim": 2, "model": {"factory": f"{NETS}:{net}"}}
    config = {"modules": {"policy": module}, "dtype": "float64", "inner": {"lr": 0.5}}
    return MetaConfig.model_validate({**config, **overrides})


def _meta_batch(tasks: int = 3, dtype: torch.dtype = torch.float64) -> dict:
    g = torch.Generator().manual_seed(0)
    obs = torch.rand(tasks, 12, 2, generator=g, dtype=dtype) * 2 - 1
    actions = torch.randn(tasks, 12, 2, generator=g, dtype=dtype)
    return {
        part: {"policy": {"obs": obs[:, rows], "actions": actions[:, rows]}}
        for part, rows in (("support", slice(0, 6)), ("query", slice(6, 12)))
    }


def test_a_layer_norm_under_second_order_vmap_is_refused_naming_its_path():
    config = _config("layer_norm_net")
    with pytest.raises(VectorizedGradientError) as error:
        refuse_wrong_batching(config, build_models(config.modules, config.seed))
    assert str(error.value) == (
        "learners.modules.policy: policy.net.1 is an nn.LayerNorm, and torch's vmap batching "
        "rule for the input gradient of layer_norm's backward is wrong (pytorch/functorch#534), "
        "so algorithm 'maml' (second order) under learners.vectorize: vmap would train on wrong "
        f"meta-gradients; {WAYS_OUT} (docs/networks.md#vmap)"
    )


@pytest.mark.parametrize(
    ("net", "overrides"),
    [
        ("layer_norm_net", {"vectorize": "loop"}),
        ("layer_norm_net", {"algorithm": "fomaml"}),
        ("mean_var_norm_net", {}),
    ],
)
def test_each_way_out_is_accepted(net, overrides):
    config = _config(net, **overrides)
    refuse_wrong_batching(config, build_models(config.modules, config.seed))


def test_the_refused_layer_gives_wrong_meta_gradients_and_each_way_out_right_ones():
    """What the refusal is for, measured: in float64 the vmapped meta-gradient of the layer
    before the LayerNorm is off by far more than rounding; the ways out agree with the loop."""
    batch = _meta_batch()

    def relative_error(net: str, **overrides: object) -> float:
        learner = MetaLearner(_config(net, **overrides))
        vmapped, _ = learner.compute_meta_gradients(batch, vectorize="vmap")
        looped, _ = learner.compute_meta_gradients(batch, vectorize="loop")
        v, lo = vmapped.params["policy"]["net.0.weight"], looped.params["policy"]["net.0.weight"]
        return float((v - lo).norm() / lo.norm())

    allowed = tolerance(torch.float64)
    assert relative_error("layer_norm_net") > 1e6 * allowed
    assert relative_error("layer_norm_net", algorithm="fomaml") <= allowed
    assert relative_error("mean_var_norm_net") <= allowed


def test_the_self_check_refuses_a_wrong_layer_no_list_knows_naming_the_parameters():
    config = _config("functional_layer_norm_net")
    learner = MetaLearner(config)
    refuse_wrong_batching(config, build_models(config.modules, config.seed))  # not on the list
    with pytest.raises(VectorizedGradientError) as error:
        check_vectorized_gradients(learner, _meta_batch())
    number = r"\d\.\de[+-]\d\d"
    expected = (
        "learners.check_vectorized: the vmapped meta-gradients of 2 tasks differ from the "
        f"per-task loop's in policy.net.0.weight (N), policy.net.0.bias (N) (relative "
        "difference; float64 tolerance 2.3e-13): a layer whose vmap batching rule is wrong; "
        f"{WAYS_OUT}, or replace that layer (docs/networks.md#vmap); a network that draws "
        "random numbers cannot be checked: set learners.check_vectorized: off"
    )
    assert re.fullmatch(re.escape(expected).replace("N", number), str(error.value))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_right_networks_pass_the_self_check(dtype):
    torch_dtype = getattr(torch, dtype)
    for net in ("mean_var_norm_net", "normed_net"):
        learner = MetaLearner(_config(net, dtype=dtype))
        check_vectorized_gradients(learner, _meta_batch(dtype=torch_dtype))


def test_the_loop_is_not_checked():
    learner = MetaLearner(_config("functional_layer_norm_net", vectorize="loop"))
    check_vectorized_gradients(learner, _meta_batch())


def test_a_checked_run_trains_exactly_as_an_unchecked_one():
    batches = [_meta_batch(), _meta_batch(tasks=4)]
    finals = []
    for check in (True, False):
        torch.manual_seed(0)
        learner = MetaLearner(_config("normed_net"))
        run_meta_training(
            learner,
            batches,
            start=0,
            stop=2,
            log_every=2,
            checkpoint_every=2,
            check_vectorized=check,
        )
        finals.append((learner.get_state(), torch.get_rng_state()))
    (checked, rng_checked), (unchecked, rng_unchecked) = finals
    assert torch.equal(rng_checked, rng_unchecked)
    for name, value in checked["params"]["policy"].items():
        assert torch.equal(value, unchecked["params"]["policy"][name])
    assert checked["weights_seq_no"] == unchecked["weights_seq_no"] == 2


def test_the_training_loop_refuses_before_the_first_step():
    learner = MetaLearner(_config("functional_layer_norm_net"))
    before = {n: p.detach().clone() for n, p in learner.meta_params["policy"].items()}
    with pytest.raises(VectorizedGradientError, match=r"^learners\.check_vectorized: "):
        run_meta_training(
            learner,
            [_meta_batch()],
            start=0,
            stop=1,
            log_every=1,
            checkpoint_every=1,
            check_vectorized=True,
        )
    assert learner.weights_seq_no == 0
    assert all(torch.equal(learner.meta_params["policy"][n], p) for n, p in before.items())
