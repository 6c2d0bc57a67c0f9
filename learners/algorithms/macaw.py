"""MACAW (Mitchell et al. 2021, "Offline Meta-Reinforcement Learning with Advantage
Weighting"): its losses, written against the whole-batch loss interface `loss(call, batch)`,
and the algorithm itself (`Macaw`, registered at the bottom).

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
from typing import Any

import torch
from torch import Tensor

from learners.algorithms.macaw_config import MacawConfig, resolve_macaw
from learners.algorithms.registry import (
    LEARNED_LRS,
    ConfigView,
    Phases,
    Resolution,
    RuleBuilders,
    inner_flags,
    register_algorithm,
)
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


class Macaw:
    """MACAW: inside, the value function first (regression to returns), then the policy
    (advantage-weighted regression with the adapted value function, plus the advantage
    head's loss); outside, value regression and advantage-weighted regression without the
    head's loss. Learned per-tensor inner rates by default."""

    names = ("macaw",)
    section = "macaw"

    def resolve(self, view: ConfigView) -> Resolution:
        inner = inner_flags(
            view, first_order=False, learned_lrs=LEARNED_LRS, default_lr="tensor", hint=""
        )
        assert view.section is None or isinstance(view.section, MacawConfig)
        macaw = resolve_macaw(view.section, view.modules, view.modules_to_update, view.given)
        return Resolution(macaw.macaw, macaw.modules, {**inner, **macaw.inner}, macaw.outer)

    def sample_columns(self, config: Any) -> tuple[str, ...]:
        return ("obs", "actions", "returns")

    def phases(self, config: Any, build: RuleBuilders) -> Phases:
        macaw = config.macaw
        policy_loss = {
            "value_module": macaw.value,
            "temperature": macaw.temperature,
            "max_weight": macaw.max_weight,
            "normalize_advantages": macaw.normalize_advantages,
            "action_std": macaw.action_std,
        }
        inner_policy = AdvantageWeightedRegression(
            **policy_loss, advantage_head_coef=macaw.advantage_head_coef
        )
        outer_policy = AdvantageWeightedRegression(**policy_loss, advantage_head_coef=0.0)
        inner = (
            build.learner({macaw.value: value_regression_loss}),
            build.learner({macaw.policy: inner_policy}),
        )
        outer = build.learner({macaw.value: value_regression_loss, macaw.policy: outer_policy})
        return Phases(inner, outer)

    def rollout_module(self, config: Any) -> str:
        return config.macaw.policy

    def compile_unsupported(self, config: Any) -> str | None:
        # Not yet verified against eager: its phases compiled for minutes and drifted beyond
        # float64 rounding from the eager step.
        return "algorithm 'macaw' (two inner phases) runs eager; compile covers one"


register_algorithm(Macaw())
