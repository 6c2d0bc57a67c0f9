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
from learners.models.spec import InputStats

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
    if spec.latent_dim:
        network = LatentConditioned(network, spec.latent_dim)
    if spec.input_stats is not None:
        standardize = Standardize(spec.input_stats, spec.observation_shape)
        network.register_forward_pre_hook(standardize, with_kwargs=True)
    if spec.model.factory is not None and ":" not in spec.loss:
        _check_head_outputs(network, spec, f"{key} {name!r}")
    return network


_DUMMY_ROWS = 2
_HEAD_KEYS = {"gaussian": ("mean", "log_std"), "mean_advantage": ("mean",)}
"""The tensors a dict-returning head must hold; the others return one tensor."""


def _check_head_outputs(network: nn.Module, spec: ModuleSpec, named: str) -> None:
    """Refuse, in one line, a factory network whose forward on a dummy batch does not give
    what `model.head` names (a built-in loss reads exactly that); a user loss reads what it
    likes, so its module is not checked."""
    head = spec.model.head
    rows = (_DUMMY_ROWS, *spec.observation_shape)
    expected = [_DUMMY_ROWS, spec.action_dim]
    dtype = next((p.dtype for p in network.parameters()), torch.float32)
    try:
        with torch.no_grad():
            outputs = network(torch.zeros(rows, dtype=dtype))
    except Exception as error:  # user code: whatever it raises, the run could not train
        first_line = str(error).splitlines()[0] if str(error) else ""
        raise ValueError(
            f"{named} raised {type(error).__name__} on a dummy batch of observations "
            f"{list(rows)}: {first_line}; its forward must take [rows, *obs_shape] "
            "(docs/networks.md#factory)"
        ) from None
    keys = _HEAD_KEYS.get(head)
    if keys is None:
        found = {"output": outputs}
    elif isinstance(outputs, Mapping) and all(k in outputs for k in keys):
        found = {k: outputs[k] for k in keys}
    else:
        got = sorted(outputs) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise ValueError(
            f"{named} gives {got} on a dummy batch of observations {list(rows)}; head {head!r} "
            f"expects a dict with {list(keys)}, each shaped {expected} (docs/networks.md#factory)"
        )
    for what, tensor in found.items():
        actual = list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        if actual != expected:
            part = "" if keys is None else f" {what!r}"
            raise ValueError(
                f"{named} gives{part} {actual} on a dummy batch of observations {list(rows)}; "
                f"head {head!r} expects {expected} ([rows, action_dim]) "
                "(docs/networks.md#factory)"
            )


class Standardize:
    """A forward pre-hook giving the network ``(obs - mean) / std`` for its first input
    (``obs``, positional or by name): the one place a module's observations are
    standardised, so training, evaluation and every consumer that builds the module from
    its spec apply the same function to raw observations. The statistics are constants,
    not parameters or buffers, so vmap, grad and the compiled step see no state."""

    def __init__(self, stats: InputStats, shape: tuple[int, ...]) -> None:
        # On the CPU whatever device the network is built on (learners build on "meta").
        self.mean = torch.tensor(stats.mean, dtype=torch.float64, device="cpu").reshape(shape)
        self.std = torch.tensor(stats.std, dtype=torch.float64, device="cpu").reshape(shape)
        self.keep = None
        if stats.ignored:
            keep = torch.ones(len(stats.mean), dtype=torch.bool, device="cpu")
            keep[list(stats.ignored)] = False
            self.keep = keep.reshape(shape)

    def __call__(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        if args:
            return (self.apply(args[0]), *args[1:]), kwargs
        return args, {**kwargs, "obs": self.apply(kwargs["obs"])}

    def apply(self, obs: torch.Tensor) -> torch.Tensor:
        """``(obs - mean) / std`` in ``obs``'s dtype and device, the ignored features 0."""
        standardized = (obs - self.mean.to(obs)) / self.std.to(obs)
        if self.keep is None:
            return standardized
        # where, not a product: an ignored feature holding inf or NaN is still 0.
        return torch.where(self.keep.to(obs.device), standardized, 0.0)


def build_models(specs: Mapping[str, ModuleSpec], seed: int) -> dict[str, nn.Module]:
    """One model per module id, initialised reproducibly from `seed`.

    The global torch RNG is forked, so building models neither depends on nor changes it.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {
            module_id: build_model(spec, module_id=module_id) for module_id, spec in specs.items()
        }
