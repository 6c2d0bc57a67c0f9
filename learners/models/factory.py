"""Networks from config: `model.factory` (a user's `package.module:callable`) or the built-in
network `model.encoder` chooses, built the same way.

A factory is called as `factory(obs_shape, action_dim, **kwargs)`: `obs_shape` the tuple of
one observation's sizes (`ModuleSpec.observation_shape`), `action_dim` the action size or
the number of discrete actions. It returns an `nn.Module` whose `forward(obs, ...)` takes
`[..., *obs_shape]` observations and gives what the module's `model.head` names (see
`learners.models.mlp`), which is what the module's loss reads. The built-in networks are
`learners.models.mlp:mlp_network` and `learners.models.conv:conv_network` with the config's
own fields as keywords.

With `latent_dim` the network is wrapped in `learners.models.conditioned.LatentConditioned`
(the factory's `obs_shape` then counts the latent). The module may hold no buffers: the
meta-learner runs it functionally over a task dimension (`torch.func.vmap`), where a buffer
updated in place (BatchNorm's running statistics) cannot be carried per task. Everything is
checked when the models are built (a learner's construction, or `load_learner`), with one
line naming the config key.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from learners.config import ModelConfig, ModuleSpec
from learners.models.conditioned import LatentConditioned
from learners.models.conv import conv_network
from learners.models.mlp import mlp_network

NetworkFactory = Callable[..., nn.Module]
"""`(obs_shape, action_dim, **kwargs) -> nn.Module`."""


def network_factory(model: ModelConfig) -> tuple[NetworkFactory | str, dict[str, Any]]:
    """The factory a model config names (a built-in callable, or the user's path unresolved)
    and the keywords it is called with."""
    if model.factory is not None:
        return model.factory, dict(model.kwargs)
    head = {
        "head": model.head,
        "hidden_sizes": model.hidden_sizes,
        "activation": model.activation,
        "log_std_init": model.log_std_init,
        "advantage_hidden_sizes": model.advantage_hidden_sizes,
    }
    if model.encoder == "conv":
        return conv_network, {"conv_channels": model.conv_channels, **head}
    return mlp_network, head


def resolve_factory(path: str, *, key: str = "model.factory") -> NetworkFactory:
    """The callable `path` ('package.module:callable') names; `key` names it in errors."""
    module_name, _, attribute = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        missing = error.name or module_name
        raise ValueError(
            f"{key} {path!r}: cannot import {module_name!r} (no module named {missing!r}); "
            "install the package that defines it or put it on PYTHONPATH"
        ) from None
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ValueError(f"{key} {path!r}: module {module_name!r} has no {attribute!r}")
    if not callable(factory):
        raise ValueError(
            f"{key} {path!r}: {attribute!r} is a {type(factory).__name__}, not a callable"
        )
    return factory


def build_model(spec: ModuleSpec, *, module_id: str | None = None) -> nn.Module:
    """The network a module spec describes (initialised from the current global RNG);
    `module_id` names the module in errors."""
    key = f"learners.modules.{module_id}.model.factory" if module_id else "model.factory"
    factory, kwargs = network_factory(spec.model)
    name = factory if isinstance(factory, str) else f"{factory.__module__}:{factory.__name__}"
    if isinstance(factory, str):
        factory = resolve_factory(factory, key=key)
    # A conditioned network's factory sees the observation with the latent appended.
    obs_shape = (spec.obs_dim + spec.latent_dim,) if spec.latent_dim else spec.observation_shape
    try:
        network = factory(obs_shape, spec.action_dim, **kwargs)
    except TypeError as error:  # most often a signature that does not take these arguments
        raise ValueError(
            f"{key} {name!r} called as (obs_shape={obs_shape}, "
            f"action_dim={spec.action_dim}, **{kwargs}) raised TypeError: {error}"
        ) from None
    if not isinstance(network, nn.Module):
        raise ValueError(
            f"{key} {name!r} returned a {type(network).__name__}; expected an nn.Module"
        )
    buffers = [buffer_name for buffer_name, _ in network.named_buffers()]
    if buffers:
        raise ValueError(
            f"{key} {name!r} returned a module with buffers {buffers}, which vmap over tasks "
            "cannot carry (e.g. BatchNorm running statistics); use a norm without running "
            "statistics (GroupNorm)"
        )
    return LatentConditioned(network, spec.latent_dim) if spec.latent_dim else network


def build_models(specs: Mapping[str, ModuleSpec], seed: int) -> dict[str, nn.Module]:
    """One model per module id, initialised reproducibly from `seed`.

    The global torch RNG is forked, so building models neither depends on nor changes it.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {
            module_id: build_model(spec, module_id=module_id) for module_id, spec in specs.items()
        }
