"""Network factories defined outside the package, as a user would write them: named in config
as `tests.learners.models.factory_nets:<name>` (or `factory_nets:<name>` with this folder on
PYTHONPATH, as the end-to-end run does)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

NOT_CALLABLE = 3
"""Named by a config to be refused: a factory must be callable."""

SEEN: list[tuple[tuple[int, ...], int, dict]] = []
"""What `recording_net` was called with, in order."""


class NormedNet(nn.Module):
    """Flattened observations, a linear layer, GroupNorm (parameters, no running buffers),
    tanh and a linear output: one output per action dimension (a deterministic head).

    Not LayerNorm: torch's batching rule for layer_norm's backward is wrong for the input's
    gradient (pytorch/functorch#534, still so in torch 2.13), so second-order meta-gradients
    through it under vmap over tasks are silently wrong (the per-task loop is right)."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, width: int) -> None:
        super().__init__()
        self.obs_dims = len(obs_shape)
        self.hidden = nn.Linear(math.prod(obs_shape), width)
        self.norm = nn.GroupNorm(2, width)
        self.out = nn.Linear(width, action_dim)

    def forward(self, obs: Tensor) -> Tensor:
        features = self.hidden(obs.flatten(-self.obs_dims))
        return self.out(torch.tanh(self.norm(features)))


def normed_net(obs_shape: tuple[int, ...], action_dim: int, *, width: int = 8) -> nn.Module:
    """A `NormedNet` of `width` hidden units."""
    return NormedNet(obs_shape, action_dim, width)


def recording_net(obs_shape: tuple[int, ...], action_dim: int, **kwargs: object) -> nn.Module:
    """Flattened observations and a linear layer; records its arguments in `SEEN`."""
    SEEN.append((obs_shape, action_dim, kwargs))
    return nn.Sequential(nn.Flatten(-len(obs_shape)), nn.Linear(math.prod(obs_shape), action_dim))


def unflattened_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """A linear layer over flat observations: cannot take `[rows, *obs_shape]` (refused)."""
    return nn.Linear(math.prod(obs_shape), action_dim)


class _GaussianNet(nn.Module):
    def __init__(self, in_dim: int, action_dim: int) -> None:
        super().__init__()
        self.mean = nn.Linear(in_dim, action_dim)
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def forward(self, obs: Tensor) -> dict[str, Tensor]:
        mean = self.mean(obs)
        return {"mean": mean, "log_std": self.log_std.expand_as(mean)}


def gaussian_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """A linear gaussian policy: what head 'gaussian' (loss gaussian_nll) reads."""
    return _GaussianNet(math.prod(obs_shape), action_dim)


def batchnorm_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """BatchNorm's running statistics are buffers: refused."""
    return nn.Sequential(nn.Linear(obs_shape[0], 4), nn.BatchNorm1d(4), nn.Linear(4, action_dim))


def not_a_module(obs_shape: tuple[int, ...], action_dim: int) -> dict:
    """Returns parameters, not a module: refused."""
    return {"weight": torch.zeros(action_dim, obs_shape[0])}


class _LayerNormed(nn.Module):
    """`net`: linear, a norm over the hidden units, tanh, linear (paths `net.0` .. `net.3`)."""

    def __init__(self, obs_shape: tuple[int, ...], action_dim: int, norm: nn.Module) -> None:
        super().__init__()
        width = 4
        self.net = nn.Sequential(
            nn.Linear(math.prod(obs_shape), width), norm, nn.Tanh(), nn.Linear(width, action_dim)
        )

    def forward(self, obs: Tensor) -> Tensor:
        return self.net(obs)


class _FunctionalLayerNorm(nn.Module):
    """`torch.nn.functional.layer_norm` with an affine of its own: the same wrong batching
    rule as `nn.LayerNorm`, but no module of a known-wrong kind to find."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))

    def forward(self, x: Tensor) -> Tensor:
        return nn.functional.layer_norm(x, x.shape[-1:], self.scale, self.shift)


class _MeanVarLayerNorm(_FunctionalLayerNorm):
    """A layer norm written from `mean` and `var`: right under vmap."""

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(-1, keepdim=True)
        var = x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) / torch.sqrt(var + 1e-5) * self.scale + self.shift


def layer_norm_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """`nn.LayerNorm` at `net.1`: refused for second-order algorithms under vmap."""
    return _LayerNormed(obs_shape, action_dim, nn.LayerNorm(4))


def functional_layer_norm_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """A layer norm no list knows of (`net.1` is a module of this file): the self-check's."""
    return _LayerNormed(obs_shape, action_dim, _FunctionalLayerNorm(4))


def mean_var_norm_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """The way out: a layer norm from `mean` and `var` at `net.1`."""
    return _LayerNormed(obs_shape, action_dim, _MeanVarLayerNorm(4))


def wide_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """One output too many for its head: refused on the dummy batch."""
    return nn.Linear(math.prod(obs_shape), action_dim + 1)


def mean_only_net(obs_shape: tuple[int, ...], action_dim: int) -> nn.Module:
    """A dict without `log_std`: refused for head 'gaussian'."""
    return _MeanOnly(math.prod(obs_shape), action_dim)


class _MeanOnly(nn.Module):
    def __init__(self, in_dim: int, action_dim: int) -> None:
        super().__init__()
        self.mean = nn.Linear(in_dim, action_dim)

    def forward(self, obs: Tensor) -> dict[str, Tensor]:
        return {"mean": self.mean(obs)}
