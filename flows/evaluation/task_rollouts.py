"""The held-out tasks rolled out: the unadapted meta-policy, the policy adapted on each
task's support transitions, and the environment's expert when it reports one.

``rollout_episodes`` environments per task (``flows.evaluation.environments``), one episode
each, task-major (episode ``e`` of task ``i`` is row ``i * rollout_episodes + e``), every
policy from the same starts (``flows.evaluation.rollouts``). ``PolicyStats`` sums each
policy up: mean return with its standard error across tasks, success rate, episode length.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flows.config import EvaluationConfig
from flows.evaluation.environments import HeldoutEnvs
from flows.evaluation.rollouts import (
    Policy,
    PolicyActions,
    RolloutResult,
    expert_policy,
    reports_expert,
    roll_out,
)
from learners.inner.differentiable import raise_on_nonfinite
from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from learners.models.factory import build_model
from pipeline.contract.schema import ObservationLayout


@dataclass(frozen=True)
class PolicyStats:
    """One policy's episodes summed up."""

    mean_return: float
    return_stderr: float | None
    """Standard error of the per-task mean returns (None with one task)."""
    success_rate: float | None
    """Share of episodes that succeeded at any step; None when the environment reports no
    success."""
    final_success_rate: float | None
    """Share of episodes whose last step reported success."""
    mean_length: float
    task_returns: list[float]
    """Each task's mean return, in the evaluated task order."""


@dataclass(frozen=True)
class TaskPolicies:
    """The policies of a learner on the evaluated held-out tasks."""

    task_ids: tuple[str, ...]
    envs: HeldoutEnvs
    actions: PolicyActions
    meta_params: Mapping[str, torch.Tensor]
    adapted: Mapping[str, torch.Tensor]
    """Each task's adapted parameters, stacked: ``[tasks, ...]`` per name."""
    expert: bool
    """Whether the environment reports ``info["expert_action"]``."""

    def policies(self, tasks: Sequence[int]) -> dict[str, Policy]:
        """Each policy for one episode row per entry of ``tasks`` (indices of ``task_ids``)."""
        index = torch.as_tensor(list(tasks), dtype=torch.long)
        adapted = {name: p[index.to(p.device)] for name, p in self.adapted.items()}
        policies = {
            "unadapted": self.actions.shared(self.meta_params),
            "adapted": self.actions.per_episode(adapted),
        }
        if self.expert:
            policies["expert"] = expert_policy
        return policies


@dataclass(frozen=True)
class TaskRollouts:
    """The policies and their episodes."""

    policies: TaskPolicies
    results: Mapping[str, RolloutResult]
    """Policy name -> its ``rollout_episodes`` episodes per task, task-major."""

    def stats(self) -> dict[str, PolicyStats]:
        """``PolicyStats`` of each policy, by name."""
        tasks = len(self.policies.task_ids)
        return {name: _stats(result, tasks) for name, result in self.results.items()}


def roll_out_tasks(
    learner: MetaLearner,
    meta_batch: Mapping[str, Any],
    task_ids: Sequence[str],
    envs: HeldoutEnvs,
    settings: EvaluationConfig,
    *,
    obs_layout: ObservationLayout | None = None,
) -> TaskRollouts:
    """Adapt to each of ``task_ids`` (rows of ``meta_batch``) on its support transitions with
    ``rollout_adapt_steps`` inner steps, then roll every policy out (module docstring).
    ``obs_layout``: the held-out data's image layout, which the environment's uint8
    observations share (they reach the policy as the batches do, ``pipeline.streams.collate``)."""
    module = learner.config.rollout_module
    model = build_model(learner.config.modules[module]).to(learner.device)
    adapted = adapt_tasks(learner, module, meta_batch["support"], settings.rollout_adapt_steps)
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    episodes = settings.rollout_episodes
    rows = [envs.make(task_id) for task_id in task_ids for _ in range(episodes)]
    generator = torch.Generator(device=learner.device).manual_seed(settings.seed)
    actions = PolicyActions(
        model, rows[0].action_space, settings.sample, generator, obs_layout=obs_layout
    )
    policies = TaskPolicies(
        task_ids=tuple(task_ids),
        envs=envs,
        actions=actions,
        meta_params=meta,
        adapted=adapted,
        expert=reports_expert(rows[0]),
    )
    task_of_row = np.repeat(np.arange(len(task_ids)), episodes)
    results = {
        name: roll_out(rows, policy, seed=settings.seed, max_steps=settings.max_episode_steps)
        for name, policy in policies.policies(task_of_row.tolist()).items()
    }
    for env in rows:
        env.close()
    return TaskRollouts(policies=policies, results=results)


def adapt_tasks(
    learner: MetaLearner, module: str, support: Mapping[str, Any], steps: int
) -> dict[str, torch.Tensor]:
    """``module``'s parameters adapted to each task of ``support`` (``[tasks, ...]`` per name):
    one vmapped ``adapt`` (the learner's per-task loop under ``vectorize: loop``). Under
    ``inner.nonfinite: error`` a non-finite update raises, as ``adapt`` of one task does.
    The rollouts' adapted policy and the posterior exploration of online context
    (``flows.evaluation.online_context``) both adapt through it."""
    if learner.config.vectorize != "vmap":
        tasks = next(iter(next(iter(support.values())).values())).shape[0]
        per_task = [
            learner.adapt(None, task_slice(support, i), steps)[module] for i in range(tasks)
        ]
        return {name: torch.stack([a[name] for a in per_task]) for name in per_task[0]}
    adapted = torch.func.vmap(
        lambda task: learner.adapt(None, task, steps)[module], randomness="different"
    )(support)
    if learner.config.inner.nonfinite == "error":
        # Inside vmap the update cannot raise: the batched parameters are checked here.
        rows = [p.reshape(p.shape[0], -1) for p in adapted.values()]
        bad = ~torch.isfinite(torch.cat(rows, dim=1)).all(dim=1)
        raise_on_nonfinite(
            {module: {"nonfinite": bad}},
            "the updated parameters of {count} held-out task(s) are non-finite",
        )
    return adapted


def _stats(result: RolloutResult, tasks: int) -> PolicyStats:
    per_task = result.returns.reshape(tasks, -1).mean(axis=1)
    return PolicyStats(
        mean_return=float(result.returns.mean()),
        return_stderr=_standard_error(per_task),
        success_rate=None if result.successes is None else float(result.successes.mean()),
        final_success_rate=None
        if result.final_successes is None
        else float(result.final_successes.mean()),
        mean_length=float(result.lengths.mean()),
        task_returns=per_task.tolist(),
    )


def _standard_error(values: np.ndarray) -> float | None:
    if len(values) < 2:
        return None
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))
