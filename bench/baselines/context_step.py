"""The hand-written context-learner meta-step `MetaLearner.step` (`algorithm: context`) is
measured against (bench/learners.py 6), written here independently of offmeta's code.

One pure function: per task (`vmap`), an encoder MLP over each support transition
`[obs, action, reward, next obs]`, the codes mean-pooled with a learned prior counted as one
more element, the policy MLP over `[query obs, latent]` and its squared error to the query
actions; `grad` of the mean over tasks, then a functional Adam update (outer lr 1e-3, as
the learner's default). Compiled whole with `torch.compile` for the compiled baseline.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from bench.baselines.meta_step import State, adam_step

ENCODER, POLICY, LATENT = "encoder/", "policy/", "latent"


class ContextShape(NamedTuple):
    """One measured context-learner step size."""

    name: str
    tasks: int
    support: int
    query: int
    obs_dim: int
    action_dim: int
    latent_dim: int
    hidden: tuple[int, ...]

    @property
    def transition(self) -> int:
        """Width of one encoded transition: obs, action, reward, next obs."""
        return 2 * self.obs_dim + self.action_dim + 1

    def config(self) -> dict:
        """The `MetaConfig` of the learner measured at this shape."""
        model = {"hidden_sizes": list(self.hidden)}
        return {
            "algorithm": "context",
            "context": {"latent_dim": self.latent_dim},
            "modules": {
                "default_policy": {
                    "obs_dim": self.obs_dim,
                    "action_dim": self.action_dim,
                    "model": model,
                },
                "encoder": {
                    "obs_dim": self.transition,
                    "action_dim": self.latent_dim,
                    "model": model,
                },
            },
        }

    def record(self) -> dict:
        return {
            "tasks": self.tasks,
            "support": self.support,
            "query": self.query,
            "latent": self.latent_dim,
            "encoder": "-".join(map(str, (self.transition, *self.hidden, self.latent_dim))),
            "policy": "-".join(
                map(str, (self.obs_dim + self.latent_dim, *self.hidden, self.action_dim))
            ),
        }


REACH = ContextShape("reach-v3", 10, 20, 20, 39, 4, 16, (256, 256))
"""Meta-World ML1 reach-v3's sizes (docs/metaworld.md), latent 16 (DESIGN.md's measured loop)."""


def context_batch(shape: ContextShape, device: torch.device, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part(rows: int) -> dict:
        def draw(*size: int) -> Tensor:
            return torch.randn(shape.tasks, rows, *size, generator=g).to(device)

        columns = {"obs": draw(shape.obs_dim), "actions": draw(shape.action_dim).tanh()}
        columns |= {"rewards": draw(), "new_obs": draw(shape.obs_dim)}
        return {"default_policy": columns}

    return {"support": part(shape.support), "query": part(shape.query)}


def context_models(shape: ContextShape, device: torch.device) -> tuple[nn.Module, nn.Module]:
    """The encoder and the policy network (over `[obs, latent]`), plain MLPs."""

    def mlp(sizes: tuple[int, ...]) -> nn.Module:
        layers: list[nn.Module] = []
        for fan_in, fan_out in itertools.pairwise(sizes):
            layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
        return nn.Sequential(*layers[:-1]).to(device)

    encoder = mlp((shape.transition, *shape.hidden, shape.latent_dim))
    policy = mlp((shape.obs_dim + shape.latent_dim, *shape.hidden, shape.action_dim))
    return encoder, policy


def context_state(encoder: nn.Module, policy: nn.Module, latent_dim: int) -> State:
    params = {ENCODER + k: p.detach().clone() for k, p in encoder.named_parameters()}
    params |= {POLICY + k: p.detach().clone() for k, p in policy.named_parameters()}
    device = next(iter(params.values())).device
    params[LATENT] = torch.zeros(latent_dim, device=device)
    zeros = {k: torch.zeros_like(p) for k, p in params.items()}
    step = torch.zeros((), device=device)
    return params, zeros, {k: z.clone() for k, z in zeros.items()}, step


def context_step(encoder: nn.Module, policy: nn.Module) -> Callable[[State, dict], State]:
    """`step(state, meta_batch) -> state`: one pure context-learner meta-step."""

    def part(params: dict, prefix: str) -> dict:
        return {k[len(prefix) :]: v for k, v in params.items() if k.startswith(prefix)}

    def task(params: dict, support: dict, query: dict) -> Tensor:
        rewards = support["rewards"][:, None]
        x = torch.cat([support["obs"], support["actions"], rewards, support["new_obs"]], -1)
        codes = functional_call(encoder, part(params, ENCODER), (x,))
        latent = (params[LATENT] + codes.sum(0)) / (codes.shape[0] + 1)
        obs = query["obs"]
        inputs = torch.cat([obs, latent.expand(obs.shape[0], -1)], -1)
        predicted = functional_call(policy, part(params, POLICY), (inputs,))
        return (predicted - query["actions"]).square().mean()

    def meta_loss(params: dict, support: dict, query: dict) -> Tensor:
        return vmap(task, in_dims=(None, 0, 0))(params, support, query).mean()

    return adam_step(grad(meta_loss))
