"""A network conditioned on a task latent that lives among its own parameters.

`LatentConditioned(network, latent_dim)` appends its parameter `latent` to every
observation before `network` sees it (`[..., obs_dim] -> [..., obs_dim + latent_dim]`; other
inputs pass as they are). As a parameter the latent travels in the module's parameter dict,
so whatever adapts a task (`learners.algorithms.context`) replaces the dict's `latent` entry,
and `predict(learner, obs, params=adapted)` runs the adapted module like any other. The
meta-parameters' entry is the latent of an empty context: the learned prior.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

LATENT = "latent"
"""The parameter name of the latent in a conditioned module's parameter dict."""


class LatentConditioned(nn.Module):
    """`network` over `[obs, latent]`; `latent` starts at zeros."""

    def __init__(self, network: nn.Module, latent_dim: int) -> None:
        super().__init__()
        self.network = network
        self.latent = nn.Parameter(torch.zeros(latent_dim))

    def forward(self, obs: Tensor, *inputs: Tensor) -> object:
        latent = self.latent.expand(*obs.shape[:-1], self.latent.shape[0])
        return self.network(torch.cat([obs, latent.to(obs.dtype)], dim=-1), *inputs)
