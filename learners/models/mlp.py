"""The MLP model family: flattened observations in, one of three heads out.

Heads: deterministic (a tensor `[B, action_dim]`), categorical (logits `[B, num_actions]`),
gaussian (a dict with `mean` `[B, action_dim]` and a state-independent `log_std`, clamped) and
mean_advantage (a dict with `mean`, plus `advantage` `[B, 1]` when actions are given: MACAW's
policy with its advantage-regression head).
Models are built from config under a fixed seed without disturbing the global RNG, so the same
config always gives the same initial parameters.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from learners.config import ModelConfig, ModuleSpec

LOG_STD_BOUNDS = (-5.0, 2.0)
"""Clamp of the gaussian head's log-std: keeps the NLL finite when the std collapses."""

_ACTIVATIONS: dict[str, type[nn.Module]] = {
    "relu": nn.ReLU,
    "tanh": nn.Tanh,
    "gelu": nn.GELU,
    "elu": nn.ELU,
    "silu": nn.SiLU,
}


class MLP(nn.Module):
    """Linear layers with an activation between them; no activation after the last one."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int,
        hidden_sizes: tuple[int, ...] = (40, 40),
        activation: str = "relu",
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

    def forward(self, obs: Tensor) -> Tensor:
        return self.layers(obs)


class GaussianMLP(nn.Module):
    """An MLP for the mean and one learned log-std per action dimension."""

    def __init__(
        self,
        in_dim: int,
        action_dim: int,
        hidden_sizes: tuple[int, ...] = (40, 40),
        activation: str = "relu",
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.mean = MLP(in_dim, action_dim, hidden_sizes, activation)
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
    ) -> None:
        super().__init__()
        if not hidden_sizes:
            raise ValueError("head 'mean_advantage' needs at least one hidden layer")
        trunk = MLP(in_dim, hidden_sizes[-1], hidden_sizes[:-1], activation)
        self.trunk = nn.Sequential(*trunk.layers, _ACTIVATIONS[activation]())
        self.mean = nn.Linear(hidden_sizes[-1], action_dim)
        self.advantage = MLP(hidden_sizes[-1] + action_dim, 1, advantage_hidden_sizes, activation)

    def forward(self, obs: Tensor, actions: Tensor | None = None) -> dict[str, Tensor]:
        features = self.trunk(obs)
        outputs = {"mean": self.mean(features)}
        if actions is not None:
            outputs["advantage"] = self.advantage(torch.cat((features, actions), dim=-1))
        return outputs


def build_model(spec: ModuleSpec) -> nn.Module:
    """The network a module spec describes (initialised from the current global RNG)."""
    model: ModelConfig = spec.model
    if model.head == "gaussian":
        return GaussianMLP(
            spec.obs_dim, spec.action_dim, model.hidden_sizes, model.activation, model.log_std_init
        )
    if model.head == "mean_advantage":
        return MeanAdvantageMLP(
            spec.obs_dim,
            spec.action_dim,
            model.hidden_sizes,
            model.activation,
            model.advantage_hidden_sizes,
        )
    return MLP(spec.obs_dim, spec.action_dim, model.hidden_sizes, model.activation)


def build_models(specs: Mapping[str, ModuleSpec], seed: int) -> dict[str, nn.Module]:
    """One model per module id, initialised reproducibly from `seed`.

    The global torch RNG is forked, so building models neither depends on nor changes it.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return {module_id: build_model(spec) for module_id, spec in specs.items()}
