"""The MLP model family: flattened observations in, one of four heads out.

Heads: deterministic (a tensor `[B, action_dim]`), categorical (logits `[B, num_actions]`),
gaussian (a dict with `mean` `[B, action_dim]` and a state-independent `log_std`, clamped) and
mean_advantage (a dict with `mean`, plus `advantage` `[B, 1]` when actions are given: MACAW's
policy with its advantage-regression head).
Each network flattens the trailing `obs_dims` dimensions of its observations itself (an
observation of shape `obs_shape` has `len(obs_shape)` of them), so `[..., *obs_shape]` in gives
`[..., outputs]` out. `mlp_network` is the built-in factory (`learners.models.factory`).
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor, nn

LOG_STD_BOUNDS = (-5.0, 2.0)
"""Clamp of the gaussian head's log-std: keeps the NLL finite when the std collapses."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
}


def activation_layer(name: str) -> nn.Module:
    """A new activation module by config name (`ModelConfig.activation`)."""
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation {name!r} is not one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name]()


class MLP(nn.Module):
    """Linear layers with an activation between them; no activation after the last one."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden_sizes: tuple[int, ...] = (40, 40),
        activation: str = "relu",
        obs_dims: int = 1,
    ) -> None:
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {sorted(_ACTIVATIONS)}")
        layers: list[nn.Module] = []
        sizes = (in_dim, *hidden_sizes)
        for fan_in, fan_out in itertools.pairwise(sizes):
            layers += [nn.Linear(fan_in, fan_out), _ACTIVATIONS[activation]()]
        layers.append(nn.Linear(sizes[-1], out_dim))
        self.layers = nn.Sequential(*layers)
        self.obs_dims = obs_dims

    def forward(self, obs: Tensor) -> Tensor:
        return self.layers(_flatten(obs, self.obs_dims))


class GaussianMLP(nn.Module):
    """An MLP for the mean and one learned log-std per action dimension."""

    def __init__(
        self,
        in_dim: int,
        action_dim: int,
        hidden_sizes: tuple[int, ...] = (40, 40),
        activation: str = "relu",
        log_std_init: float = 0.0,
        obs_dims: int = 1,
    ) -> None:
        super().__init__()
        self.mean = MLP(in_dim, action_dim, hidden_sizes, activation, obs_dims)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))

    def forward(self, obs: Tensor) -> dict[str, Tensor]:
        mean = self.mean(obs)
        log_std = self.log_std.clamp(*LOG_STD_BOUNDS).expand_as(mean)
        return {"mean": mean, "log_std": log_std}


class MeanAdvantageMLP(nn.Module):
    """An MLP for the action mean with a second head that predicts the advantage of a given
    action from the last hidden layer's features and the action (Mitchell et al. 2021,
    "Offline Meta-Reinforcement Learning with Advantage Weighting", section 4.2)."""

    def __init__(
        self,
        in_dim: int,
        action_dim: int,
        hidden_sizes: tuple[int, ...] = (40, 40),
        activation: str = "relu",
        advantage_hidden_sizes: tuple[int, ...] = (32,),
        obs_dims: int = 1,
    ) -> None:
        super().__init__()
        if not hidden_sizes:
            raise ValueError("head 'mean_advantage' needs at least one hidden layer")
        trunk = MLP(in_dim, hidden_sizes[-1], hidden_sizes[:-1], activation)
        self.trunk = nn.Sequential(*trunk.layers, _ACTIVATIONS[activation]())
        self.mean = nn.Linear(hidden_sizes[-1], action_dim)
        self.advantage = MLP(hidden_sizes[-1] + action_dim, 1, advantage_hidden_sizes, activation)
        self.obs_dims = obs_dims

    def forward(self, obs: Tensor, actions: Tensor | None = None) -> dict[str, Tensor]:
        features = self.trunk(_flatten(obs, self.obs_dims))
        outputs = {"mean": self.mean(features)}
        if actions is not None:
            outputs["advantage"] = self.advantage(torch.cat((features, actions), dim=-1))
        return outputs


def mlp_network(
    obs_shape: tuple[int, ...],
    action_dim: int,
    *,
    head: str = "deterministic",
    hidden_sizes: tuple[int, ...] = (40, 40),
    activation: str = "relu",
    log_std_init: float = 0.0,
    advantage_hidden_sizes: tuple[int, ...] = (32,),
) -> nn.Module:
    """The built-in MLP with `head` (`ModelConfig.head`) over observations of `obs_shape`,
    flattened (initialised from the current global RNG)."""
    in_dim, obs_dims = math.prod(obs_shape), len(obs_shape)
    hidden_sizes = tuple(hidden_sizes)
    if head == "gaussian":
        return GaussianMLP(in_dim, action_dim, hidden_sizes, activation, log_std_init, obs_dims)
    if head == "mean_advantage":
        return MeanAdvantageMLP(
            in_dim, action_dim, hidden_sizes, activation, tuple(advantage_hidden_sizes), obs_dims
        )
    if head not in ("deterministic", "categorical"):
        raise ValueError(
            f"head {head!r} is not one of deterministic, gaussian, categorical, mean_advantage"
        )
    return MLP(in_dim, action_dim, hidden_sizes, activation, obs_dims)


def _flatten(obs: Tensor, obs_dims: int) -> Tensor:
    # Flat observations (one dimension) go through untouched, as they always have.
    return obs.flatten(-obs_dims) if obs_dims > 1 else obs
