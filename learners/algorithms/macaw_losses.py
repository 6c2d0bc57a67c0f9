"""MACAW's losses (Mitchell et al. 2021, "Offline Meta-Reinforcement Learning with Advantage
Weighting"), written against the whole-batch loss interface `loss(call, batch)`; the
algorithm itself is `learners.algorithms.macaw`.

- `value_regression_loss`: the value function's squared error to the Monte-Carlo return-to-go
  (`returns`, derived per episode at ingest; no bootstrap, as the authors' released config).
- `AdvantageWeightedRegression`: the policy's negative log-likelihood of the recorded action
  under a gaussian of fixed standard deviation, each row weighted by `exp(A / temperature)`
  clipped at `max_weight`, where `A = returns - V(obs)` comes from the value module as the
  current step sees it (the adapted one in the inner loop and in the outer loss) and carries no
  gradient. With `advantage_head_coef > 0` (the inner loss) the policy's advantage head also
  regresses `A` from (features, action): the paper's richer inner update, since the weighted
  log-likelihood alone tells the policy little about which actions were good.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from learners.losses import ModuleCall, column, gaussian_nll_per_row, matching


def value_regression_loss(call: ModuleCall, batch: Mapping[str, Tensor]) -> Tensor:
    """Mean squared error of the module's output on `obs` to `returns`."""
    returns = column(call, batch, "returns")
    values = call(call.module_id, column(call, batch, "obs"))
    return (matching(values, returns, "value regression", "returns") - returns).square().mean()


def advantage_weights(
    advantages: Tensor, *, temperature: float, max_weight: float, normalize: bool
) -> Tensor:
    """`exp(A / temperature)` clipped at `max_weight`, after standardising `A` over the batch
    when `normalize` (the paper's default)."""
    if normalize:
        # The floor keeps the weights finite (all 1) when every advantage is equal.
        scale = advantages.std() + torch.finfo(advantages.dtype).eps
        advantages = (advantages - advantages.mean()) / scale
    return torch.exp(torch.clamp(advantages / temperature, max=math.log(max_weight)))


@dataclass(frozen=True)
class AdvantageWeightedRegression:
    """The policy's loss; `advantage_head_coef = 0` is the outer (query) loss."""

    value_module: str
    temperature: float
    max_weight: float
    normalize_advantages: bool
    action_std: float
    advantage_head_coef: float

    def __call__(self, call: ModuleCall, batch: Mapping[str, Tensor]) -> Tensor:
        obs = column(call, batch, "obs")
        actions = column(call, batch, "actions")
        returns = column(call, batch, "returns")
        values = matching(call(self.value_module, obs), returns, "macaw", "returns")
        advantages = (returns - values).detach()
        weights = advantage_weights(
            advantages,
            temperature=self.temperature,
            max_weight=self.max_weight,
            normalize=self.normalize_advantages,
        )
        with_head = self.advantage_head_coef > 0
        outputs = call(call.module_id, obs, actions) if with_head else call(call.module_id, obs)
        mean = matching(outputs["mean"], actions, "macaw policy")
        log_std = torch.full_like(mean, math.log(self.action_std))
        per_row = gaussian_nll_per_row(mean, log_std, actions)
        loss = (weights * per_row).mean()
        if with_head:
            predicted = matching(outputs["advantage"], advantages, "macaw advantage head")
            loss = loss + self.advantage_head_coef * (predicted - advantages).square().mean()
        return loss
