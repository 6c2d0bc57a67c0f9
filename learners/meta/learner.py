"""The meta (outer) learner over task meta-batches, for every algorithm of `learners.algorithms`.

One meta-step: for every task, adapt the meta-parameters on its support set with the inner
rule (`learners.inner.rule`: one or more phases of `DifferentiableLearner.update`), take the
outer loss of the adapted parameters on its query set, average over tasks, back-propagate
into the meta-parameters (and learned learning rates) and step the outer torch optimizer.
Tasks run under `torch.func.vmap` by default; the per-task loop computes the same gradient
and serves as fallback and reference.

`step` never waits for the device: a non-finite value met under an `error` policy halts
the learner (nothing changes from that step on) and `check_finite` raises it at the next
check point (`run_meta_training` checks at every log and checkpoint; `get_state` too).
With `config.compile` the whole step runs as one compiled function
(`learners.meta.compiled_step`); eager is the reference.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple

import torch
from torch import Tensor, nn

from learners.algorithms.catalog import algorithm_for
from learners.config import MetaConfig
from learners.inner.differentiable import raise_on_nonfinite
from learners.inner.optim import init_log_lrs, lrs_from_log
from learners.inner.rule import build_inner_rule
from learners.meta.compiled_step import CompiledMetaStep, MetaStepParts
from learners.meta.meta_batch import MetaBatch, check_meta_batch, task_slice
from learners.meta.outer_step import InnerCheck, OuterRule, OuterStep
from learners.meta.precision import with_float32_matmul
from learners.metrics import MetricsLogger
from learners.models.factory import build_models
from learners.params import (
    Batch,
    Params,
    buffers_from_modules,
    detach_params,
    params_from_modules,
    to_device,
)

STATE_FORMAT = 1
# How each step metric is logged (the mean over a window unless named here): sums of events
# per reporting period, and None for those not logged (num_tasks goes to throughput and
# lifetime counters; weights_seq_no lives in the state).
_REDUCE = {
    "inner_nonfinite_tasks": "sum",
    "outer_skipped": "sum",
    "num_tasks": None,
    "weights_seq_no": None,
    "num_tasks_trained": "throughput",
    "num_tasks_trained_lifetime": "lifetime_sum",
}
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_RUN_SETTINGS = ("compile", "float32_matmul")
"""Config fields a saved state may differ in: how the step runs, not what it optimises."""
# What each task reports per module (`_task_objective`), as the columns of one tensor: its
# losses, then the count of its non-finite inner steps, or under inner.nonfinite='error' with
# vmap the sum of squares of its adapted parameters (infinite or NaN: a non-finite step).
_LOSSES = ("query_loss", "support_loss_before", "support_loss_after")
_AUX = (*_LOSSES, "nonfinite")
_AFTER = "support_loss_after"
"""The one metric that costs a forward pass of its own (`step(support_loss_after=False)`)."""
_NONFINITE = _AUX.index("nonfinite")


class MetaGradients(NamedTuple):
    """Meta-gradients, shaped like the meta-parameters and the learned log learning rates."""

    params: Params
    log_lrs: dict[str, Tensor]
    inner: InnerCheck | None = None
    """What the inner updates met under inner.nonfinite='error' (vmap; None otherwise)."""

    def tensors(self) -> list[Tensor]:
        """Every gradient in the learner's canonical order (e.g. for an all-reduce)."""
        flat = [g for named in self.params.values() for g in named.values()]
        return flat + list(self.log_lrs.values())


class MetaLearner:
    """A meta-learner built from a `MetaConfig` (or its dict), optionally around user models.

    `models` replace the networks the config would build (same module ids); they give the
    forward structure and the initial parameters, and are never modified. `metrics` is the
    logger (or a `scope` of a shared one) this learner writes to.
    """

    def __init__(
        self,
        config: MetaConfig | Mapping[str, Any],
        *,
        models: Mapping[str, nn.Module] | None = None,
        device: torch.device | str | None = None,
        metrics: MetricsLogger | None = None,
    ) -> None:
        self.config = (
            config if isinstance(config, MetaConfig) else MetaConfig.model_validate(config)
        )
        cfg = self.config
        self.device = torch.device(device if device is not None else "cpu")
        if models is None:
            models = build_models(cfg.modules, cfg.seed)
        elif sorted(models) != sorted(cfg.modules):
            raise ValueError(
                f"models {sorted(models)} must match config.modules {sorted(cfg.modules)}"
            )
        self._models = dict(models)
        self._trained = cfg.trained_modules
        self._data_modules = cfg.data_modules
        dtype = _DTYPES[cfg.dtype]
        self._params = to_device(params_from_modules(self._models), self.device, dtype)
        for module_id, named in self._params.items():
            for p in named.values():
                p.requires_grad_(module_id in self._trained)
        self._buffers = to_device(buffers_from_modules(self._models), self.device, dtype)
        self._rule = build_inner_rule(cfg, self._models, self._buffers)
        self._log_lrs = init_log_lrs(
            self._params, cfg.inner.learned_lr, cfg.inner.lr, self._trained
        )
        for log_lr in self._log_lrs.values():
            log_lr.requires_grad_(True)
        self._leaves = [p for m in self._trained for p in self._params[m].values()]
        self._leaves += list(self._log_lrs.values())
        self._optimizer = _outer_optimizer(cfg, self._params, self._log_lrs)
        self.metrics = metrics if metrics is not None else MetricsLogger()
        # Per task, with and without the support loss after adaptation. Under
        # inner.nonfinite='error' the update leaves its check to `_task_objective`, which
        # reports one sum of squares of all adapted parameters: a norm per tensor inside vmap
        # costs several times more.
        adapted_out = cfg.inner.nonfinite == "error"
        self._vmapped_tasks = {
            after: torch.func.vmap(
                functools.partial(
                    self._task_objective, support_loss_after=after, adapted_out=adapted_out
                ),
                in_dims=(None, None, 0, 0),
                randomness="different",
            )
            for after in (True, False)
        }
        self._outer = OuterStep(
            OuterRule.of(cfg.outer, self._optimizer, self._leaves),
            self._optimizer,
            self._leaves,
            self._trained,
        )
        self._compiled = self._compiled_step() if cfg.compile != "off" else None

    @property
    def meta_params(self) -> Params:
        """The live meta-parameters (read them, do not write them)."""
        return self._params

    @property
    def log_lrs(self) -> dict[str, Tensor]:
        """The live learned log learning rates (empty unless Meta-SGD)."""
        return self._log_lrs

    @property
    def weights_seq_no(self) -> int:
        """Outer updates applied so far (one device sync)."""
        return self._outer.weights_seq_no

    @property
    def compiled_step(self) -> CompiledMetaStep | None:
        """The compiled meta-step (its `compilations`, `compile_seconds` and `fallback`), or
        None when `config.compile` is 'off'."""
        return self._compiled

    @with_float32_matmul
    def step(
        self, meta_batch: MetaBatch, *, support_loss_after: bool = True
    ) -> dict[str, Tensor | int]:
        """One meta-step: `compute_meta_gradients` then `apply_meta_gradients` (or both as
        one compiled function), logged.

        Returns 0-d detached tensors (call `float()` when needed) and `num_tasks`; nothing
        here waits for the device, so a non-finite value met under an `error` policy is
        raised by the next `check_finite`. `support_loss_after=False` leaves that metric out
        of an eager step (neither returned nor logged): it is the one metric that needs a
        forward pass of its own, and `run_meta_training` asks for it only on the steps whose
        value a metrics read will see. The compiled step always measures it.
        """
        metrics = self._compiled.step(meta_batch) if self._compiled is not None else None
        if metrics is None:
            grads, metrics = self.compute_meta_gradients(
                meta_batch, support_loss_after=support_loss_after
            )
            metrics.update(self.apply_meta_gradients(grads))
        self.metrics.log_many(metrics, _REDUCE)
        num_tasks = metrics["num_tasks"]
        tasks = {"num_tasks_trained": num_tasks, "num_tasks_trained_lifetime": num_tasks}
        self.metrics.log_many(tasks, _REDUCE)
        return metrics

    @with_float32_matmul
    def compute_meta_gradients(
        self,
        meta_batch: MetaBatch,
        *,
        support_loss_after: bool = True,
        vectorize: Literal["vmap", "loop"] | None = None,
    ) -> tuple[MetaGradients, dict]:
        """Meta-gradients of the mean query loss over the meta-batch's tasks, without stepping.

        Workers of a data-parallel run each call this on their shard, average the gradients
        (`MetaGradients.tensors()`), and call `apply_meta_gradients`. With
        `support_loss_after=False` the metrics leave that loss out (see `step`). `vectorize`
        overrides the config's choice for this call (`learners.meta.vectorized_check` compares
        the two).
        """
        vectorize = self.config.vectorize if vectorize is None else vectorize
        support, query, num_tasks = self._prepare(meta_batch)
        for leaf in self._leaves:
            leaf.grad = None
        if vectorize == "vmap":
            objective = self._vmapped_tasks[support_loss_after]
            totals, aux = objective(self._params, self._log_lrs, support, query)
            totals.mean().backward()
        else:
            per_task = []
            for index in range(num_tasks):
                total, task_aux = self._task_objective(
                    self._params,
                    self._log_lrs,
                    task_slice(support, index),
                    task_slice(query, index),
                    support_loss_after=support_loss_after,
                )
                (total / num_tasks).backward()
                per_task.append(task_aux)
            aux = {m: torch.stack([a[m] for a in per_task]) for m in per_task[0]}
        metrics, inner = self._outcome(
            aux, num_tasks, after=support_loss_after, vectorized=vectorize == "vmap"
        )
        grads = MetaGradients(
            {m: {n: _grad_of(p) for n, p in self._params[m].items()} for m in self._trained},
            {k: _grad_of(v) for k, v in self._log_lrs.items()},
            inner,
        )
        return grads, metrics

    def apply_meta_gradients(self, grads: MetaGradients) -> dict[str, Tensor | int]:
        """Clip and apply meta-gradients with the outer optimizer; `weights_seq_no += 1`.

        A non-finite meta-gradient, or an inner one in `grads.inner`, under an `error`
        policy halts the learner (see `check_finite`); under outer.nonfinite='skip' a
        non-finite meta-gradient leaves everything unchanged (reported as outer_skipped=1).
        Nothing waits for the device.
        """
        flat = grads.tensors()
        if len(flat) != len(self._leaves):
            raise ValueError(f"expected {len(self._leaves)} gradients, got {len(flat)}")
        for leaf, grad in zip(self._leaves, flat, strict=True):
            if grad.shape != leaf.shape:
                raise ValueError(f"gradient shape {tuple(grad.shape)} != {tuple(leaf.shape)}")
        metrics: dict[str, Tensor | int] = dict(self._outer.apply(flat, grads.inner))
        metrics.update(_lr_stats(list(self._log_lrs.values())))
        return metrics

    def check_finite(self) -> None:
        """Raise `NonFiniteGradientError` if a step met a non-finite inner gradient or
        meta-gradient under an `error` policy (one device sync).

        The step that met it and every later one changed nothing (parameters, optimizer
        state, `weights_seq_no`); the error names that step's `weights_seq_no` and is raised
        again by every check until `set_state` loads a state.
        """
        self._outer.check_finite()

    @with_float32_matmul
    def adapt(self, params: Params | None, support: Batch, steps: int | None = None) -> Params:
        """Parameters adapted to one task's `support` batch (no task dimension) with exactly
        the training inner rule and the current learned learning rates; `params=None` means
        the meta-parameters and `steps=None` the training steps. The result carries no graph
        to the meta-parameters."""
        params = self._params if params is None else params
        steps = self.config.inner.steps if steps is None else steps
        if steps == 0:
            return detach_params(params)
        with torch.no_grad():
            adapted, _ = self._rule.adapt(
                params, self._rule.expand(support), lrs=self._current_lrs(), steps=steps
            )
        return detach_params(adapted)

    def evaluate(
        self, meta_batch: MetaBatch, steps: Iterable[int] = (0, 1, 5, 10)
    ) -> dict[int, float]:
        """Mean query loss over tasks after adapting on support for each number of `steps`.

        No gradient reaches the meta-parameters (adaptation differentiates only the
        adapted copies).
        """
        per_task = self.evaluate_tasks(meta_batch, steps)
        curves = torch.stack(list(per_task.values()), dim=1)
        return dict(zip(per_task, curves.mean(0).tolist(), strict=True))

    @with_float32_matmul
    def evaluate_tasks(
        self, meta_batch: MetaBatch, steps: Iterable[int] = (0, 1, 5, 10)
    ) -> dict[int, Tensor]:
        """`evaluate` before the mean: each task's query loss (a `[tasks]` tensor, in the
        meta-batch's task order) for each number of `steps`, in increasing order."""
        wanted = sorted(set(steps))
        if not wanted or wanted[0] < 0:
            raise ValueError(f"steps must be non-negative integers, got {list(steps)}")
        support, query, num_tasks = self._prepare(meta_batch)
        params = detach_params(self._params)
        lrs = self._current_lrs()
        with torch.no_grad():
            if self.config.vectorize == "vmap":
                run = torch.func.vmap(
                    lambda s, q: self._adapt_curve(params, lrs, s, q, wanted),
                    randomness="different",
                )
                curves, nonfinite = run(support, query)
                if self.config.inner.nonfinite == "error" and nonfinite:
                    # Inside vmap the inner update cannot raise (the per-task loop did).
                    raise_on_nonfinite(
                        {m: {"nonfinite": (bad > 0).sum()} for m, bad in nonfinite.items()},
                        f"met in {{count}} of {num_tasks} tasks adapting for evaluate "
                        f"(steps {wanted})",
                    )
            else:
                curves = torch.stack(
                    [
                        self._adapt_curve(
                            params, lrs, task_slice(support, i), task_slice(query, i), wanted
                        )[0]
                        for i in range(num_tasks)
                    ]
                )
        return dict(zip(wanted, curves.unbind(1), strict=True))

    def get_state(self) -> dict[str, Any]:
        """Everything needed to rebuild this learner and continue exactly (`from_state`);
        `check_finite` first, so a halted learner is never saved."""
        self.check_finite()
        rng: dict[str, Tensor] = {"torch": torch.get_rng_state()}
        if self.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.device)
        return {
            "format": STATE_FORMAT,
            "config": self.config.model_dump(mode="json"),
            "params": {
                m: {n: p.detach().clone() for n, p in named.items()}
                for m, named in self._params.items()
            },
            "buffers": {
                m: {n: b.clone() for n, b in named.items()} for m, named in self._buffers.items()
            },
            "log_lrs": {k: v.detach().clone() for k, v in self._log_lrs.items()},
            "optimizer": copy.deepcopy(self._optimizer.state_dict()),
            "rng": rng,
            "weights_seq_no": self.weights_seq_no,
            "metrics": self.metrics.get_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Load a `get_state()` result taken from a learner with the same config."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(
                f"learner state format {state.get('format')!r}, expected {STATE_FORMAT}"
            )
        # How the step runs (compiled or eager, TF32 or not) does not change what it optimises.
        mine = self.config.model_dump(mode="json", exclude=set(_RUN_SETTINGS))
        # Validated again, so that a state saved before a field was added compares equal.
        saved = MetaConfig.model_validate(state["config"])
        theirs = saved.model_dump(mode="json", exclude=set(_RUN_SETTINGS))
        if theirs != mine:
            differing = sorted(k for k in mine if mine.get(k) != theirs.get(k))
            raise ValueError(
                f"the state was saved with a different config (differs in {differing})"
            )
        with torch.no_grad():
            for module_id, named in self._params.items():
                for name, p in named.items():
                    p.copy_(state["params"][module_id][name])
            for key, log_lr in self._log_lrs.items():
                log_lr.copy_(state["log_lrs"][key])
            for module_id, named in self._buffers.items():
                for name, b in named.items():
                    b.copy_(state["buffers"][module_id][name])
        self._optimizer.load_state_dict(copy.deepcopy(state["optimizer"]))
        torch.set_rng_state(state["rng"]["torch"])
        if "cuda" in state["rng"] and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["rng"]["cuda"], self.device)
        self._outer.reset(int(state["weights_seq_no"]))
        self.metrics.set_state(state["metrics"])

    @classmethod
    def from_state(
        cls,
        state: Mapping[str, Any],
        *,
        models: Mapping[str, nn.Module] | None = None,
        device: torch.device | str | None = None,
        metrics: MetricsLogger | None = None,
    ) -> MetaLearner:
        """A learner rebuilt from `get_state()` alone (pass `models` if it was built with some)."""
        learner = cls(state["config"], models=models, device=device, metrics=metrics)
        learner.set_state(state)
        return learner

    def _prepare(self, meta_batch: MetaBatch) -> tuple[Batch, Batch, int]:
        """(support, query, number of tasks) of a meta-batch checked at the boundary, each
        batch expanded by the inner rule (derived inputs such as MACAW's advantages)."""
        support, query, num_tasks = check_meta_batch(meta_batch, self._data_modules)
        return self._rule.expand(support), self._rule.expand(query), num_tasks

    def _outcome(
        self,
        aux: dict[str, Tensor],
        num_tasks: int,
        *,
        after: bool = True,
        vectorized: bool | None = None,
    ) -> tuple[dict[str, Tensor | int], InnerCheck | None]:
        """Step metrics from the per-task aux values (per module, `[tasks, len(_AUX)]`; the
        support loss after adaptation measured if `after`), and, under inner.nonfinite='error'
        with vmap, what the inner updates met (the per-task loop raises at once instead).
        There the last column holds the adapted parameters' sums of squares; otherwise each
        task's count of non-finite inner steps. `vectorized` None: as the config says."""
        vectorized = self.config.vectorize == "vmap" if vectorized is None else vectorized
        checked_here = self.config.inner.nonfinite == "error" and vectorized
        # Per module: tasks with a non-finite inner step (the metric sums them).
        with torch.no_grad():
            if checked_here:
                counts = {m: (~torch.isfinite(a[:, _NONFINITE])).sum() for m, a in aux.items()}
            else:
                counts = {m: (a[:, _NONFINITE] > 0).sum() for m, a in aux.items()}
        metrics = self._task_metrics(aux, counts, num_tasks, after)
        if not checked_here:
            return metrics, None
        zero = torch.zeros((), dtype=torch.int64, device=self.device)
        tasks = torch.stack([counts.get(m, zero) for m in self._trained])
        return metrics, InnerCheck(tasks, num_tasks)

    def _compiled_step(self) -> CompiledMetaStep:
        parts = MetaStepParts(
            prepare=self._prepare,
            objective=self._vmapped_tasks[True],
            outcome=self._outcome,
            params=self._params,
            trained=self._trained,
            log_lr_keys=list(self._log_lrs),
            outer=self._outer,
            lr_stats=_lr_stats,
        )
        unsupported = None
        if self.config.vectorize != "vmap":
            unsupported = "the per-task loop (vectorize='loop') runs eager; compile vmaps"
        reason = algorithm_for(self.config.algorithm).compile_unsupported(self.config)
        if reason is not None:
            unsupported = reason
        custom = [
            name
            for name in ("compute_meta_gradients", "apply_meta_gradients")
            if getattr(type(self), name) is not getattr(MetaLearner, name)
        ]
        if custom:
            unsupported = (
                f"{type(self).__name__} overrides {' and '.join(custom)}, which the compiled "
                "step (one function from meta-batch to update) would bypass"
            )
        return CompiledMetaStep(self.config.compile, parts, unsupported=unsupported)

    def _current_lrs(self) -> Params | None:
        if not self._log_lrs:
            return None
        detached = {key: log_lr.detach() for key, log_lr in self._log_lrs.items()}
        return lrs_from_log(detached, self._params, self.config.inner.learned_lr)

    def _task_objective(
        self,
        params: Params,
        log_lrs: dict[str, Tensor],
        support: Batch,
        query: Batch,
        *,
        support_loss_after: bool,
        adapted_out: bool = False,
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """One task's summed query loss (the meta-objective) and, per module, its detached
        aux values (`_AUX`, in one tensor: a single output per module costs vmap less than
        one per value; the support loss after adaptation is 0 when not asked for). Under vmap
        every value gains a leading task dimension. With `adapted_out` (under
        inner.nonfinite='error') the last value is the sum of squares of the module's
        adapted parameters instead, for `_outcome` to check."""
        lrs = lrs_from_log(log_lrs, params, self.config.inner.learned_lr) if log_lrs else None
        adapted, inner = self._rule.adapt(params, support, lrs=lrs, check_nonfinite=not adapted_out)
        query_losses = self._rule.outer_losses(adapted, query)
        with torch.no_grad():  # records: no graph, so the values need no detach
            after = self._rule.inner_losses(adapted, support) if support_loss_after else None
            aux: dict[str, Tensor] = {}
            for m, loss in query_losses.items():
                if adapted_out:
                    flat = [p.reshape(-1) for p in adapted[m].values()]
                    last = torch.cat(flat).square().sum()
                else:
                    last = inner[m]["nonfinite"]
                measured = after[m] if after is not None else torch.zeros_like(loss)
                aux[m] = torch.stack([loss.detach(), inner[m]["loss_before"], measured, last])
        if len(query_losses) == 1:  # the sum of one loss is that loss, exactly
            (total,) = query_losses.values()
            return total, aux
        return torch.stack(list(query_losses.values())).sum(), aux

    def _adapt_curve(
        self, params: Params, lrs: Params | None, support: Batch, query: Batch, steps: list[int]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """One task's query loss after each number of `steps`, and per adapted module its
        inner updates' `nonfinite` metric summed over the points."""
        # Each point adapts from the meta-parameters: with several phases, k steps mean k
        # steps of each phase in turn, which continuing from k - 1 steps would not give.
        losses = []
        nonfinite: dict[str, Tensor] = {}
        for target in steps:
            adapted = params
            if target:
                adapted, inner = self._rule.adapt(params, support, lrs=lrs, steps=target)
                for m, metrics in inner.items():
                    nonfinite[m] = nonfinite.get(m, 0) + metrics["nonfinite"]
            losses.append(torch.stack(list(self._rule.outer_losses(adapted, query).values())).sum())
        return torch.stack(losses), nonfinite

    def _task_metrics(
        self,
        aux: dict[str, Tensor],
        nonfinite: dict[str, Tensor],
        num_tasks: int,
        after: bool,
    ) -> dict[str, Tensor | int]:
        """Step metrics from per-module aux values shaped [tasks, len(_AUX)]: losses are means
        over tasks summed over modules; inner_nonfinite_tasks sums `nonfinite`, each module's
        count of tasks with a non-finite step."""
        # One reduction over tasks per module, of all columns at once: a column reduced on
        # its own is summed in another order and would change the reported losses in their
        # last bit. A loss not measured keeps its column, as zeros, so that the others are
        # reduced exactly as when it is.
        with torch.no_grad():
            stacked = {m: a.mean(0) for m, a in aux.items()}
        means = {m: dict(zip(_AUX, mean.unbind(), strict=True)) for m, mean in stacked.items()}
        if len(means) == 1:  # the sums over one module are its values, exactly
            (total,) = means.values()
            (nonfinite_tasks,) = nonfinite.values()
        else:
            sums = torch.stack(list(stacked.values())).sum(0).unbind()
            total = dict(zip(_AUX, sums, strict=True))
            nonfinite_tasks = torch.stack(list(nonfinite.values())).sum()
        metrics: dict[str, Tensor | int] = {
            key: total[key] for key in _LOSSES if after or key != _AFTER
        }
        metrics["inner_nonfinite_tasks"] = nonfinite_tasks
        metrics["num_tasks"] = num_tasks
        if len(means) > 1:
            for m, mean in means.items():
                metrics[f"{m}/query_loss"] = mean["query_loss"]
                if after:
                    metrics[f"{m}/{_AFTER}"] = mean[_AFTER]
        return metrics


def _lr_stats(log_lrs: list[Tensor]) -> dict[str, Tensor]:
    """Mean, least and largest learned inner learning rate (none without them)."""
    if not log_lrs:
        return {}
    with torch.no_grad():
        flat = torch.cat([v.reshape(-1) for v in log_lrs]).exp()
        return {
            "inner_lr_mean": flat.mean(),
            "inner_lr_min": flat.min(),
            "inner_lr_max": flat.max(),
        }


def _grad_of(leaf: Tensor) -> Tensor:
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def _outer_optimizer(
    config: MetaConfig, params: Params, log_lrs: dict[str, Tensor]
) -> torch.optim.Optimizer:
    """The outer optimizer, one parameter group per learning rate in the leaves' order
    (`outer.module_lr`, `outer.log_lr_lr`); one group when every leaf shares `outer.lr`."""
    outer = config.outer
    groups: dict[float, list[Tensor]] = {}
    for module_id in config.trained_modules:
        lr = outer.module_lr.get(module_id, outer.lr)
        groups.setdefault(lr, []).extend(params[module_id].values())
    if log_lrs:
        lr = outer.log_lr_lr if outer.log_lr_lr is not None else outer.lr
        groups.setdefault(lr, []).extend(log_lrs.values())
    param_groups = [{"params": leaves, "lr": lr} for lr, leaves in groups.items()]
    if outer.optimizer == "adam":
        return torch.optim.Adam(
            param_groups, lr=outer.lr, betas=outer.betas, weight_decay=outer.weight_decay
        )
    return torch.optim.SGD(
        param_groups, lr=outer.lr, momentum=outer.momentum, weight_decay=outer.weight_decay
    )
