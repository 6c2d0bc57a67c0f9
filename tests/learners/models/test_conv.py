"""The built-in conv encoder (`model.encoder: conv`): its documented output sizes, every head
after it, leading dimensions, the config checks, and meta-training through it (vmap against
the per-task loop, meta-gradients against finite differences in float64)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from learners import MetaConfig, MetaLearner, ModuleSpec, build_model
from learners.models.conv import ConvEncoder
from tests.helpers.references import FD_STEP, central_differences
from tests.helpers.tolerances import largest, rounding_tolerance

F64 = torch.float64
# A 1x6x6 image through conv layers of 2 channels (4x4 on 1 channel: 16-term dot products;
# 3x3 on 2: 18), then a 6-unit tanh layer over 2x3x3 = 18 features, one inner step and the
# query loss, each forward and backward a few hundred rounded operations; the second-order
# backward pass retraces them: under 4,000 along the longest chain.
_OPS = 4_000


def _image_config(**overrides) -> dict:
    module = {
        "obs_dim": 36,
        "obs_shape": [1, 6, 6],
        "action_dim": 1,
        "model": {
            "encoder": "conv",
            "conv_channels": [2, 2],
            "hidden_sizes": [6],
            "activation": "tanh",
        },
    }
    config = {"modules": {"m": module}, "dtype": "float64", "inner": {"lr": 0.1}}
    config.update(overrides)
    return config


def _image_batch(tasks=3, k=4, q=5, seed=0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part(rows):
        images = torch.rand(tasks, rows, 1, 6, 6, generator=g, dtype=F64)
        return {"m": {"obs": images, "actions": images.mean((-3, -2, -1)).unsqueeze(-1)}}

    return {"support": part(k), "query": part(q)}


@pytest.mark.parametrize(
    ("image", "features"),
    [((3, 32, 32), 32 * 8 * 8), ((3, 64, 64), 32 * 16 * 16), ((1, 4, 4), 32 * 1 * 1)],
)
def test_the_encoder_quarters_height_and_width_as_documented(image, features):
    encoder = ConvEncoder(image)
    assert encoder.features == features
    assert encoder(torch.rand(2, *image)).shape == (2, features)


def test_leading_dimensions_are_folded_into_the_batch_and_back():
    encoder = ConvEncoder((3, 8, 8), (4, 4, 4))
    images = torch.rand(2, 5, 3, 8, 8)
    torch.testing.assert_close(encoder(images), torch.stack([encoder(i) for i in images]))
    assert encoder(images[0, 0]).shape == (encoder.features,)


@pytest.mark.parametrize(
    ("head", "loss", "keys"),
    [
        ("deterministic", "mse", None),
        ("categorical", "cross_entropy", None),
        ("gaussian", "gaussian_nll", {"mean", "log_std"}),
        ("mean_advantage", "mse", {"mean", "advantage"}),
    ],
)
def test_every_head_follows_the_encoder(head, loss, keys):
    spec = ModuleSpec(
        obs_dim=3 * 16 * 16,
        obs_shape=(3, 16, 16),
        action_dim=4,
        model={"encoder": "conv", "head": head},
        loss=loss,
    )
    network = build_model(spec)
    images, actions = torch.rand(5, 3, 16, 16), torch.rand(5, 4)
    outputs = network(images, actions) if head == "mean_advantage" else network(images)
    if keys is None:
        assert outputs.shape == (5, 4)
    else:
        assert set(outputs) == keys and outputs["mean"].shape == (5, 4)
    names = [name for name, _ in network.named_parameters()]
    assert names[:2] == ["encoder.layers.0.weight", "encoder.layers.0.bias"]
    assert all(name.startswith(("encoder.", "head.")) for name in names)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"obs_dim": 12, "obs_shape": [3, 4], "action_dim": 1, "model": {"encoder": "conv"}},
            "Value error, model.encoder 'conv' reads [C, H, W] observations, but obs_shape is "
            "[3, 4]; set obs_shape to the image's [C, H, W]",
        ),
        (
            {"obs_dim": 12, "action_dim": 1, "model": {"encoder": "conv"}},
            "Value error, model.encoder 'conv' reads [C, H, W] observations, but obs_shape is "
            "[12]; set obs_shape to the image's [C, H, W]",
        ),
        (
            {"obs_dim": 12, "obs_shape": [3, 2, 3], "action_dim": 1},
            "Value error, obs_shape [3, 2, 3] holds 18 values but obs_dim is 12; "
            "expected obs_dim: 18",
        ),
        (
            {"obs_dim": 12, "action_dim": 1, "model": {"conv_channels": []}},
            "Value error, conv_channels must name at least one layer, each >= 1, got []",
        ),
    ],
)
def test_conv_configs_are_refused_in_one_line(spec, message):
    with pytest.raises(ValidationError) as error:
        ModuleSpec.model_validate(spec)
    assert error.value.errors()[0]["msg"] == message


def test_images_smaller_than_the_stack_are_refused():
    spec = ModuleSpec(obs_dim=9, obs_shape=(1, 3, 3), action_dim=1, model={"encoder": "conv"})
    with pytest.raises(ValueError) as error:
        build_model(spec)
    assert str(error.value) == (
        "images of shape [1, 3, 3] are too small for 3 conv layers; expected at least 4x4 pixels"
    )


@pytest.mark.parametrize("algorithm", ["maml", "metasgd"])
def test_vmap_over_tasks_equals_the_per_task_loop(algorithm):
    config = _image_config(algorithm=algorithm, inner={"lr": 0.1, "steps": 2})
    vmapped, looped = MetaLearner(config), MetaLearner({**config, "vectorize": "loop"})
    meta_batch = _image_batch()
    grads_v, metrics_v = vmapped.compute_meta_gradients(meta_batch)
    grads_l, metrics_l = looped.compute_meta_gradients(meta_batch)
    magnitude = largest([*grads_v.tensors(), metrics_v["query_loss"]])
    atol = rounding_tolerance(F64, magnitude=magnitude, ops=_OPS)
    for a, b in zip(grads_v.tensors(), grads_l.tensors(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    torch.testing.assert_close(metrics_v["query_loss"], metrics_l["query_loss"], rtol=0, atol=atol)


def test_the_second_order_meta_gradient_matches_finite_differences():
    learner = MetaLearner(_image_config())
    meta_batch = _image_batch(tasks=2)
    grads, metrics = learner.compute_meta_gradients(meta_batch)
    atol = rounding_tolerance(F64, magnitude=float(metrics["query_loss"]), ops=_OPS)
    atol /= 2 * FD_STEP
    conv = learner.meta_params["m"]["encoder.layers.0.weight"]
    numeric = central_differences(lambda: learner.evaluate(meta_batch, steps=(1,))[1], conv)
    torch.testing.assert_close(
        grads.params["m"]["encoder.layers.0.weight"], numeric, atol=atol, rtol=0
    )


def test_a_conv_config_round_trips_through_its_json():
    config = MetaConfig.model_validate(_image_config())
    again = MetaConfig.model_validate_json(config.model_dump_json())
    assert again == config and again.modules["m"].obs_shape == (1, 6, 6)
