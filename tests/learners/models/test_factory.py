"""Network factories (`model.factory`): the arguments a factory gets, its network under vmap
over tasks, second-order meta-gradients, Meta-SGD and `compile`, and one-line refusals; the
built-in MLP over shaped observations (`obs_shape`)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from learners import MetaConfig, MetaLearner, ModuleSpec, build_model, build_models
from tests.helpers.references import FD_STEP, central_differences
from tests.helpers.tolerances import largest, rounding_tolerance
from tests.learners.models import factory_nets

F64 = torch.float64
NETS = "tests.learners.models.factory_nets"
# A 2-8-1 net with GroupNorm (a mean and a variance over 8 units: a few dozen operations),
# up to 2 inner steps on 4 rows and the query loss on 5, each forward and backward a few
# hundred rounded operations; the second-order backward pass retraces them: under 3,000.
_OPS = 3_000


def _config(model: dict | None = None, **overrides) -> dict:
    module = {
        "obs_dim": 2,
        "action_dim": 1,
        "model": model or {"factory": f"{NETS}:normed_net", "kwargs": {"width": 8}},
    }
    config = {"modules": {"m": module}, "dtype": "float64", "inner": {"lr": 0.1}}
    config.update(overrides)
    return config


def _meta_batch(tasks=3, k=4, q=5, seed=0, dtype=F64, shape=(2,)) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part(rows):
        obs = torch.rand(tasks, rows, *shape, generator=g, dtype=dtype) * 4 - 2
        actions = torch.sin(obs.flatten(2).sum(-1, keepdim=True))
        return {"m": {"obs": obs, "actions": actions}}

    return {"support": part(k), "query": part(q)}


def test_the_factory_gets_the_observation_shape_the_action_size_and_its_kwargs():
    factory_nets.SEEN.clear()
    spec = ModuleSpec(
        obs_dim=12,
        obs_shape=[3, 4],
        action_dim=5,
        model={"factory": f"{NETS}:recording_net", "kwargs": {"sizes": (4, 4), "name": "x"}},
    )
    network = build_model(spec)
    # kwargs are JSON values, the same in training and in load_learner: a tuple is a list.
    assert factory_nets.SEEN == [((3, 4), 5, {"sizes": [4, 4], "name": "x"})]
    assert isinstance(network[1], torch.nn.Linear)
    factory_nets.SEEN.clear()
    build_model(ModuleSpec(obs_dim=6, action_dim=2, model={"factory": f"{NETS}:recording_net"}))
    assert factory_nets.SEEN == [((6,), 2, {})]


def test_the_network_equals_the_same_module_handed_to_the_learner():
    config = _config()
    from_config = MetaLearner(config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.get("seed", 0))
        model = factory_nets.normed_net((2,), 1, width=8)
    handed = MetaLearner(config, models={"m": model})
    meta_batch = _meta_batch()
    grads_c, _ = from_config.compute_meta_gradients(meta_batch)
    grads_h, _ = handed.compute_meta_gradients(meta_batch)
    for a, b in zip(grads_c.tensors(), grads_h.tensors(), strict=True):
        assert torch.equal(a, b)
    assert sorted(from_config.meta_params["m"]) == [
        "hidden.bias",
        "hidden.weight",
        "norm.bias",
        "norm.weight",
        "out.bias",
        "out.weight",
    ]


@pytest.mark.parametrize(
    "overrides",
    [{}, {"algorithm": "metasgd", "inner": {"lr": 0.05, "steps": 2}}],
    ids=["maml", "metasgd"],
)
def test_vmap_over_tasks_equals_the_per_task_loop(overrides):
    config = {**_config(), **overrides}
    vmapped, looped = MetaLearner(config), MetaLearner({**config, "vectorize": "loop"})
    meta_batch = _meta_batch(tasks=4)
    grads_v, metrics_v = vmapped.compute_meta_gradients(meta_batch)
    grads_l, metrics_l = looped.compute_meta_gradients(meta_batch)
    atol = rounding_tolerance(
        F64, magnitude=largest([*grads_v.tensors(), metrics_v["query_loss"]]), ops=_OPS
    )
    for a, b in zip(grads_v.tensors(), grads_l.tensors(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    torch.testing.assert_close(metrics_v["query_loss"], metrics_l["query_loss"], rtol=0, atol=atol)


def test_meta_sgd_meta_gradients_match_finite_differences_in_float64():
    learner = MetaLearner(_config(algorithm="metasgd", inner={"lr": 0.1, "steps": 2}))
    with torch.no_grad():  # rates that differ per element exercise Meta-SGD fully
        for log_lr in learner.log_lrs.values():
            log_lr.add_(0.3 * torch.randn(log_lr.shape, dtype=F64))
    meta_batch = _meta_batch(tasks=2)
    grads, metrics = learner.compute_meta_gradients(meta_batch)
    atol = rounding_tolerance(F64, magnitude=float(metrics["query_loss"]), ops=_OPS)
    atol /= 2 * FD_STEP
    pairs = [(learner.meta_params["m"][n], grads.params["m"][n]) for n in ("norm.weight",)]
    pairs += [(learner.log_lrs[k], grads.log_lrs[k]) for k in learner.log_lrs if "norm" in k]
    assert len(pairs) == 3  # norm.weight, and the learned rates of norm.weight and norm.bias
    for leaf, analytic in pairs:
        numeric = central_differences(lambda: learner.evaluate(meta_batch, steps=(2,))[2], leaf)
        torch.testing.assert_close(analytic, numeric, rtol=0, atol=atol)


def test_a_gaussian_factory_is_read_by_the_gaussian_nll_loss():
    config = _config(algorithm="fomaml")
    model = {"factory": f"{NETS}:gaussian_net", "head": "gaussian"}
    config["modules"]["m"] |= {"model": model, "loss": "gaussian_nll"}
    learner = MetaLearner(config)
    metrics = learner.step(_meta_batch())
    # The inner step lowers the negative log-likelihood the loss reads from mean and log_std.
    assert float(metrics["support_loss_after"]) < float(metrics["support_loss_before"])
    assert sorted(learner.meta_params["m"]) == ["log_std", "mean.bias", "mean.weight"]


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (
            "no_such_package.nets:net",
            "learners.modules.m.model.factory 'no_such_package.nets:net': cannot import "
            "'no_such_package.nets' (no module named 'no_such_package'); install the package "
            "that defines it or put it on PYTHONPATH",
        ),
        (
            f"{NETS}:missing",
            f"learners.modules.m.model.factory '{NETS}:missing': module '{NETS}' has no 'missing'",
        ),
        (
            f"{NETS}:NOT_CALLABLE",
            f"learners.modules.m.model.factory '{NETS}:NOT_CALLABLE': 'NOT_CALLABLE' is a "
            "int, not a callable",
        ),
        (
            f"{NETS}:not_a_module",
            f"learners.modules.m.model.factory '{NETS}:not_a_module' returned a dict; "
            "expected an nn.Module",
        ),
        (
            f"{NETS}:batchnorm_net",
            f"learners.modules.m.model.factory '{NETS}:batchnorm_net' returned a module with "
            "buffers ['1.running_mean', '1.running_var', '1.num_batches_tracked'], which vmap "
            "over tasks cannot carry (e.g. BatchNorm running statistics); use a norm without "
            "running statistics (GroupNorm)",
        ),
        (
            f"{NETS}:wide_net",
            f"learners.modules.m.model.factory '{NETS}:wide_net' gives [2, 2] on a dummy batch "
            "of observations [2, 2]; head 'deterministic' expects [2, 1] ([rows, action_dim]) "
            "(docs/networks.md#factory)",
        ),
    ],
)
def test_a_factory_that_cannot_build_the_network_is_refused_in_one_line(factory, message):
    with pytest.raises(ValueError) as error:
        MetaLearner(_config({"factory": factory}))
    assert str(error.value) == message


def test_a_factory_whose_forward_fails_on_shaped_observations_is_refused_in_one_line():
    spec = ModuleSpec(
        obs_dim=12, obs_shape=[3, 4], action_dim=5, model={"factory": f"{NETS}:unflattened_net"}
    )
    with pytest.raises(ValueError) as error:
        build_model(spec, module_id="m")
    assert str(error.value) == (
        f"learners.modules.m.model.factory '{NETS}:unflattened_net' raised RuntimeError on a "
        "dummy batch of observations [2, 3, 4]: mat1 and mat2 shapes cannot be multiplied (6x4 "
        "and 12x5); its forward must take [rows, *obs_shape] (docs/networks.md#factory)"
    )


def test_a_factory_without_the_tensors_its_head_names_is_refused_in_one_line():
    model = {"factory": f"{NETS}:mean_only_net", "head": "gaussian"}
    with pytest.raises(ValueError) as error:
        MetaLearner(
            _config(
                model,
                modules={
                    "m": {**_config()["modules"]["m"], "model": model, "loss": "gaussian_nll"}
                },
            )
        )
    assert str(error.value) == (
        f"learners.modules.m.model.factory '{NETS}:mean_only_net' gives ['mean'] on a dummy "
        "batch of observations [2, 2]; head 'gaussian' expects a dict with ['mean', 'log_std'], "
        "each shaped [2, 1] (docs/networks.md#factory)"
    )


@pytest.mark.parametrize(
    ("model", "message"),
    [
        (
            {"factory": "factory_nets.normed_net"},
            "Value error, factory 'factory_nets.normed_net' must be written "
            "'package.module:callable'",
        ),
        (
            {"kwargs": {"width": 8}},
            "Value error, kwargs ['width'] are the factory's; set factory or drop kwargs",
        ),
        (
            {"factory": f"{NETS}:normed_net", "encoder": "conv"},
            f"Value error, encoder 'conv' chooses a built-in network, which factory "
            f"'{NETS}:normed_net' replaces; drop one of them",
        ),
        (
            {"factory": f"{NETS}:normed_net", "kwargs": {"scale": float("nan")}},
            "Value error, kwargs must be JSON values (they are saved): Out of range float "
            "values are not JSON compliant",
        ),
    ],
)
def test_model_configs_are_refused_in_one_line(model, message):
    with pytest.raises(ValidationError) as error:
        MetaConfig.model_validate(_config(model))
    assert error.value.errors()[0]["msg"] == message


def test_a_factory_config_round_trips_through_its_json():
    config = MetaConfig.model_validate(_config())
    again = MetaConfig.model_validate_json(config.model_dump_json())
    assert again == config
    assert again.modules["m"].model.factory == f"{NETS}:normed_net"
    assert again.modules["m"].model.kwargs == {"width": 8}


def test_the_built_in_mlp_flattens_shaped_observations_itself():
    shaped = ModuleSpec(obs_dim=6, obs_shape=(2, 3), action_dim=1)
    flat = ModuleSpec(obs_dim=6, action_dim=1)
    shaped_model, flat_model = (
        build_models({"m": shaped}, 0)["m"],
        build_models({"m": flat}, 0)["m"],
    )
    obs = torch.rand(4, 5, 2, 3)
    torch.testing.assert_close(shaped_model(obs), flat_model(obs.reshape(4, 5, 6)), rtol=0, atol=0)


def test_a_learner_over_shaped_observations_takes_them_flat_or_shaped():
    config = _config({"hidden_sizes": [8], "activation": "tanh"})
    config["modules"]["m"] |= {"obs_dim": 6, "obs_shape": [2, 3]}
    learner = MetaLearner(config)
    shaped = _meta_batch(shape=(2, 3))
    flat = {
        part: {"m": {**columns["m"], "obs": columns["m"]["obs"].flatten(2)}}
        for part, columns in shaped.items()
    }
    grads_s, _ = learner.compute_meta_gradients(shaped)
    grads_f, _ = learner.compute_meta_gradients(flat)
    for a, b in zip(grads_s.tensors(), grads_f.tensors(), strict=True):
        assert torch.equal(a, b)
