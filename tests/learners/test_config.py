"""Learner configs: defaults, algorithm flags, validation messages, documentation, round trip."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from learners import InnerConfig, MetaConfig, ModelConfig, ModuleSpec, OuterConfig


def _message(error: pytest.ExceptionInfo[ValidationError]) -> str:
    return error.value.errors()[0]["msg"]


def test_defaults_are_the_sinusoid_maml_setup():
    config = MetaConfig()
    assert config.algorithm == "maml"
    assert list(config.modules) == ["default_policy"]
    spec = config.modules["default_policy"]
    assert (spec.obs_dim, spec.action_dim, spec.model.hidden_sizes, spec.loss) == (
        1,
        1,
        (40, 40),
        "mse",
    )
    assert (config.inner.lr, config.inner.steps, config.inner.first_order) == (0.01, 1, False)
    assert (config.outer.optimizer, config.outer.lr, config.vectorize) == ("adam", 1e-3, "vmap")


@pytest.mark.parametrize(
    ("algorithm", "first_order", "learned_lr"),
    [("maml", False, "none"), ("fomaml", True, "none"), ("metasgd", False, "element")],
)
def test_the_algorithm_sets_the_inner_flags(algorithm, first_order, learned_lr):
    inner = MetaConfig(algorithm=algorithm).inner
    assert (inner.first_order, inner.learned_lr) == (first_order, learned_lr)


def test_metasgd_accepts_first_order_and_other_lr_shapes():
    config = MetaConfig(algorithm="metasgd", inner={"first_order": True, "learned_lr": "scalar"})
    assert (config.inner.first_order, config.inner.learned_lr) == (True, "scalar")


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"algorithm": "maml", "inner": {"first_order": True}},
            "Value error, algorithm 'maml' sets inner.first_order=False; choose fomaml instead, "
            "or drop inner.first_order",
        ),
        (
            {"algorithm": "fomaml", "inner": {"learned_lr": "element"}},
            "Value error, algorithm 'fomaml' needs inner.learned_lr in ['none'], got 'element'; "
            "use algorithm 'metasgd'",
        ),
        (
            {"algorithm": "metasgd", "inner": {"learned_lr": "none"}},
            "Value error, algorithm 'metasgd' needs inner.learned_lr in "
            "['scalar', 'tensor', 'element'], got 'none'; pick one",
        ),
        (
            {"modules_to_update": ["nope"]},
            "Value error, modules_to_update ['nope'] must name at least one of the modules "
            "['default_policy']; unknown: ['nope']",
        ),
        (
            {"modules": {"a/b": {"obs_dim": 1, "action_dim": 1}}},
            "Value error, module id 'a/b' must be non-empty and contain no '/' (it names "
            "checkpoint entries and metric keys)",
        ),
        ({"modules": {}}, "Value error, at least one module is required"),
    ],
)
def test_invalid_meta_configs_say_what_is_wrong(config, message):
    with pytest.raises(ValidationError) as error:
        MetaConfig.model_validate(config)
    assert _message(error) == message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"loss": "cross_entropy"},
            "Value error, loss 'cross_entropy' cannot train a 'deterministic' head; "
            "use head 'categorical'",
        ),
        (
            {"loss": "gaussian_nll", "model": {"head": "categorical"}},
            "Value error, loss 'gaussian_nll' cannot train a 'categorical' head; "
            "use head 'gaussian'",
        ),
        (
            {"loss": "huber"},
            "Value error, unknown loss 'huber': expected one of ['cross_entropy', 'gaussian_nll', "
            "'mse'] or a user function written 'package.module:function'",
        ),
        (
            {"model": {"hidden_sizes": [4, 0]}},
            "Value error, every hidden size must be >= 1, got [4, 0]",
        ),
        ({"obs_dim": 0}, "Input should be greater than or equal to 1"),
    ],
)
def test_invalid_module_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValidationError) as error:
        ModuleSpec.model_validate({"obs_dim": 1, "action_dim": 1, **spec})
    assert _message(error) == message


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError) as error:
        InnerConfig(learning_rate=0.1)
    assert error.value.errors()[0]["type"] == "extra_forbidden"
    assert error.value.errors()[0]["loc"] == ("learning_rate",)
    with pytest.raises(ValidationError, match="both betas must lie in"):
        InnerConfig(betas=(0.9, 1.0))


@pytest.mark.parametrize("model", [MetaConfig, ModuleSpec, ModelConfig, InnerConfig, OuterConfig])
def test_every_field_is_documented(model: type[BaseModel]):
    assert model.__doc__
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    assert undocumented == []


def test_a_dumped_config_validates_to_the_same_config():
    config = MetaConfig(
        algorithm="metasgd",
        modules={
            "bc": {
                "obs_dim": 4,
                "action_dim": 2,
                "loss": "gaussian_nll",
                "model": {"head": "gaussian"},
            }
        },
        inner={"optimizer": "adam", "steps": 3, "clip_norm": 1.0},
    )
    dumped = config.model_dump(mode="json")
    assert MetaConfig.model_validate(dumped) == config
    assert MetaConfig.model_validate(dumped).model_dump(mode="json") == dumped
