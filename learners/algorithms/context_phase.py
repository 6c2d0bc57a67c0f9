"""The context-encoder learner's phase and losses (`ContextConfig` states the objective;
`learners.algorithms.context` registers it): adaptation encodes the support set into a task
latent instead of taking gradient steps.

Adapted parameters are the meta-parameters with every conditioned module's `latent` entry
replaced by `(prior + sum_i encoder(x_i)) / (K + 1)`, `x_i` the i-th support transition's
`fields` concatenated and `prior` that module's own `latent` parameter: a mean over the
context with the prior counted as one more element, so the latent does not depend on the
order of the transitions and K = 0 gives the prior. `adapt(None, support)` then
`predict(learner, obs, params=adapted)` works as for MAML; more inner steps give the same
latent (there is nothing to iterate). Everything is a function of parameter dicts, so the
meta-step vmaps over tasks and compiles like MAML's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from learners.algorithms.context_config import ContextConfig
from learners.algorithms.macaw_losses import AdvantageWeightedRegression, value_regression_loss
from learners.algorithms.registry import Phase, Phases, RuleBuilders
from learners.losses import ModuleCall, column, matching
from learners.models.conditioned import LATENT
from learners.models.spec import InputStats
from learners.params import Batch, Params


class Encoded(NamedTuple):
    """What `ContextEncoding.update` gives back, as a `DifferentiableLearner` update does."""

    params: Params
    metrics: dict[str, dict[str, Tensor]]


@dataclass(frozen=True)
class ContextEncoding:
    """The context learner's one inner phase: the support set encoded into each conditioned
    module's latent (module docstring); its losses are the meta-objective's (`objective`)."""

    encoder: str
    conditioned: tuple[str, ...]
    fields: tuple[str, ...]
    call: Callable[[str, Params], ModuleCall]
    objective: Phase

    def update(
        self,
        params: Params,
        batches: Batch,
        *,
        lrs: Params | None = None,
        steps: int | None = None,
        check_nonfinite: bool = True,
    ) -> Encoded:
        """`params` with the latents of `batches` (one task's support set); per conditioned
        module with a loss, `loss_before` (its loss at the priors) and `nonfinite` (1 when
        its latent is not finite). `lrs`, `steps` and `check_nonfinite` are the inner
        learner's and change nothing here."""
        rows, call = batches[self.encoder], self.call(self.encoder, params)
        dtype = next(iter(params[self.encoder].values())).dtype
        parts = [column(call, rows, name) for name in self.fields]
        parts = [part.reshape(part.shape[0], -1).to(dtype) for part in parts]
        codes = call(self.encoder, torch.cat(parts, dim=-1))
        total, count = codes.sum(0), codes.shape[0] + 1
        adapted = dict(params)
        for module_id in self.conditioned:
            prior = params[module_id][LATENT]
            adapted[module_id] = {**params[module_id], LATENT: (prior + total) / count}
        with torch.no_grad():
            before = self.objective.compute_losses(params, batches)
            finite = torch.isfinite(total).all()
        metrics = {
            m: {"loss_before": loss, "nonfinite": (~finite).to(loss.dtype)}
            for m, loss in before.items()
        }
        return Encoded(adapted, metrics)

    def compute_losses(self, params: Params, batch: Batch) -> dict[str, Tensor]:
        return self.objective.compute_losses(params, batch)


@dataclass(frozen=True, eq=False)
class TaskModelLoss:
    """`coef` times the squared error of the module's `[reward, next obs]` from
    `[obs, action]` (and its latent). With `obs_stats` the next observation is predicted
    standardised as the policy sees observations (rewards come standardised in the batch
    when `data.normalize` names them), so no target dwarfs the others."""

    coef: float
    obs_stats: tuple[Tensor, Tensor] | None = None
    """`(mean, std)` of the observations, float64 on the CPU (moved to the data's device and
    dtype when used, as `learners.models.factory.Standardize` does)."""

    def __call__(self, call: ModuleCall, batch: Mapping[str, Tensor]) -> Tensor:
        obs, actions = column(call, batch, "obs"), column(call, batch, "actions")
        rewards, new_obs = column(call, batch, "rewards"), column(call, batch, "new_obs")
        if self.obs_stats is not None:
            mean, std = self.obs_stats
            new_obs = (new_obs - mean.to(new_obs)) / std.to(new_obs)
        rows = obs.shape[0]
        inputs = torch.cat([obs, actions.reshape(rows, -1).to(obs.dtype)], dim=-1)
        target = torch.cat([rewards.reshape(rows, 1).to(obs.dtype), new_obs], dim=-1)
        predicted = matching(call(call.module_id, inputs), target, "task model", "[reward, obs]")
        return self.coef * (predicted - target).square().mean()


def context_phases(
    context: ContextConfig, build: RuleBuilders, obs_stats: InputStats | None = None
) -> Phases:
    """The encoding phase and the meta-objective `context` describes; `obs_stats` are the
    policy's (`ModuleSpec.input_stats`)."""
    losses = {context.policy: build.loss(context.policy)}
    if context.value is not None:
        losses[context.policy] = AdvantageWeightedRegression(
            value_module=context.value,
            temperature=context.temperature,
            max_weight=context.max_weight,
            normalize_advantages=context.normalize_advantages,
            action_std=context.action_std,
            advantage_head_coef=0.0,
        )
        losses[context.value] = value_regression_loss
    if context.task_model is not None:
        stats = None
        if obs_stats is not None:
            stats = tuple(
                torch.tensor(v, dtype=torch.float64) for v in (obs_stats.mean, obs_stats.std)
            )
        losses[context.task_model] = TaskModelLoss(context.task_model_coef, stats)
    objective = build.learner(losses)
    conditioned = tuple(m for m in context.roles().values() if m != context.encoder)
    encoding = ContextEncoding(context.encoder, conditioned, context.fields, build.call, objective)
    return Phases((encoding,), objective)
