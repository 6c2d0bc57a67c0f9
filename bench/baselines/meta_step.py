"""The hand-written meta-steps `MetaLearner.step` is measured against (bench/learners.py 5).

MAML with the learner's defaults (one inner SGD step at lr 0.01, MSE, outer Adam at 1e-3),
written as directly as torch allows:

- `torch_func_step`: one pure function, `grad` of the mean over tasks of a `vmap`ped inner
  `grad` step and query loss, then a functional Adam update; compiled whole with
  `torch.compile` for the compiled baseline (the issue's reference figures);
- `autograd_step`: the `vmap`ped inner step with an ordinary `.backward()` and
  `torch.optim.Adam` (eager only; the fastest eager form on CPU).

Plus the meta-batches of the three shapes measured, on any device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from learners import MLP

INNER_LR = 0.01
OUTER_LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8

State = tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor], Tensor]
"""(params, exp_avg, exp_avg_sq, step)."""


class Shape(NamedTuple):
    """One measured meta-step size."""

    name: str
    tasks: int
    support: int
    query: int
    obs_dim: int
    action_dim: int
    hidden: tuple[int, ...]

    def config(self) -> dict[str, Any]:
        """The `MetaConfig` (MAML defaults) of this shape's learner."""
        model = {"hidden_sizes": list(self.hidden)}
        spec = {"obs_dim": self.obs_dim, "action_dim": self.action_dim, "model": model}
        return {"modules": {"default_policy": spec}}

    def record(self) -> dict[str, Any]:
        mlp = "-".join(map(str, (self.obs_dim, *self.hidden, self.action_dim)))
        return {"tasks": self.tasks, "support": self.support, "query": self.query, "mlp": mlp}


SHAPES = (
    Shape("sinusoid", 25, 10, 10, 1, 1, (40, 40)),
    Shape("one-task", 1, 5, 5, 1, 1, (40, 40)),
    Shape("large", 64, 256, 256, 20, 6, (256, 256)),
    # Meta-World ML1 reach-v3 as docs/metaworld.md trains it: 10 tasks, K = Q = 20, 39-256-256-4.
    Shape("reach-v3", 10, 20, 20, 39, 4, (256, 256)),
)


def meta_batch(shape: Shape, device: torch.device, seed: int = 0) -> dict:
    """Sinusoid-like regression tasks of `shape`: actions are sines of the summed inputs
    with a per-task amplitude and phase."""
    g = torch.Generator().manual_seed(seed)
    rows = shape.support + shape.query
    obs = torch.rand(shape.tasks, rows, shape.obs_dim, generator=g) * 10 - 5
    amplitude = torch.rand(shape.tasks, 1, shape.action_dim, generator=g) * 4.9 + 0.1
    phase = torch.rand(shape.tasks, 1, shape.action_dim, generator=g) * torch.pi
    actions = amplitude * torch.sin(obs.sum(-1, keepdim=True) - phase)

    def part(cut: slice) -> dict:
        columns = {"obs": obs[:, cut].contiguous(), "actions": actions[:, cut].contiguous()}
        return {"default_policy": {k: v.to(device) for k, v in columns.items()}}

    return {"support": part(slice(0, shape.support)), "query": part(slice(shape.support, None))}


def model_of(shape: Shape, device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return MLP(shape.obs_dim, shape.action_dim, shape.hidden).to(device)


def torch_func_step(model: nn.Module) -> Callable[[State, dict], State]:
    """`step(state, meta_batch) -> state`: one pure MAML meta-step with functional Adam."""

    def loss(params: dict, obs: Tensor, actions: Tensor) -> Tensor:
        return (functional_call(model, params, (obs,)) - actions).square().mean()

    def task(params: dict, support: dict, query: dict) -> Tensor:
        g = grad(loss)(params, support["obs"], support["actions"])
        adapted = {k: p - INNER_LR * g[k] for k, p in params.items()}
        return loss(adapted, query["obs"], query["actions"])

    def meta_loss(params: dict, support: dict, query: dict) -> Tensor:
        return vmap(task, in_dims=(None, 0, 0))(params, support, query).mean()

    return adam_step(grad(meta_loss))


def adam_step(meta_grad: Callable[[dict, dict, dict], dict]) -> Callable[[State, dict], State]:
    """One outer step from ``meta_grad(params, support, query)`` of the policy's meta-batch:
    Adam written out functionally (lr ``OUTER_LR``, ``BETAS``, ``EPS``: the learner's defaults),
    so that the whole step is one pure function to compile."""

    def step(state: State, batch: dict) -> State:
        params, exp_avg, exp_avg_sq, count = state
        g = meta_grad(params, batch["support"]["default_policy"], batch["query"]["default_policy"])
        count = count + 1
        exp_avg = {k: BETAS[0] * exp_avg[k] + (1 - BETAS[0]) * g[k] for k in g}
        exp_avg_sq = {k: BETAS[1] * exp_avg_sq[k] + (1 - BETAS[1]) * g[k] * g[k] for k in g}
        correction1, correction2 = 1 - BETAS[0] ** count, 1 - BETAS[1] ** count
        params = {
            k: p
            - OUTER_LR * (exp_avg[k] / correction1) / ((exp_avg_sq[k] / correction2).sqrt() + EPS)
            for k, p in params.items()
        }
        return params, exp_avg, exp_avg_sq, count

    return step


def initial_state(model: nn.Module) -> State:
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    zeros = {k: torch.zeros_like(p) for k, p in params.items()}
    step = torch.zeros((), device=next(iter(params.values())).device)
    return params, zeros, {k: z.clone() for k, z in zeros.items()}, step


def autograd_step(model: nn.Module) -> Callable[[dict], None]:
    """`step(meta_batch)`: the vmapped inner step, `.backward()` and `torch.optim.Adam`."""
    params = {k: p.detach().clone().requires_grad_() for k, p in model.named_parameters()}
    optimizer = torch.optim.Adam(params.values(), lr=OUTER_LR, betas=BETAS, eps=EPS)

    def loss(p: dict, obs: Tensor, actions: Tensor) -> Tensor:
        return (functional_call(model, p, (obs,)) - actions).square().mean()

    def task(p: dict, support: dict, query: dict) -> Tensor:
        g = grad(loss)(p, support["obs"], support["actions"])
        adapted = {k: v - INNER_LR * g[k] for k, v in p.items()}
        return loss(adapted, query["obs"], query["actions"])

    def step(batch: dict) -> None:
        optimizer.zero_grad(set_to_none=True)
        support, query = batch["support"]["default_policy"], batch["query"]["default_policy"]
        vmap(task, in_dims=(None, 0, 0))(params, support, query).mean().backward()
        optimizer.step()

    return step
