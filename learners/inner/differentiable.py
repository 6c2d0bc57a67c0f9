"""The differentiable (inner) learner: functional updates of parameter dicts.

`DifferentiableLearner.update(params, batches)` runs inner steps and returns new parameters;
the graph from the incoming parameters to the returned ones is kept (second-order) unless the
config asks for first-order, in which case the inner gradients are detached. Gradients come
from `torch.func.grad`, so the whole update can run inside `torch.func.vmap` over tasks.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from learners.config import InnerConfig
from learners.inner.optim import NamedTensors, inner_optimizer
from learners.losses import LossFn, ModuleCall, untied_modules
from learners.params import Batch, Params
from learners.torch_compat import in_vmap
from learners.transforms import StepInputs, descend, global_norm

OptState = Any
"""One module's inner-optimizer state: the state of `inner_optimizer(config)`'s chain."""


class NonFiniteGradientError(FloatingPointError):
    """A gradient held NaN or ±inf and the configured policy is `error`."""


class UpdateResult(NamedTuple):
    """What one `DifferentiableLearner.update` returns."""

    params: Params
    """Every module's parameters after the update (modules not updated: the same tensors)."""
    loss_per_module: dict[str, Tensor]
    """Mean loss over every inner step (every minibatch), detached, per updated module."""
    metrics: dict[str, dict[str, Tensor]]
    """Per updated module: `loss_before` (at the incoming params, first minibatch) and
    `nonfinite` (skip, zero: steps whose gradient was non-finite; error: 1 if the update met
    one, which outside vmap raises instead)."""
    opt_state: dict[str, OptState]
    """Inner optimizer state per module, to pass back in to continue."""


class DifferentiableLearner:
    """Inner learner over several modules, each with its own model, loss and gradients.

    `modules` only provide the forward structure (`functional_call`); their own parameters
    are never read or written. `buffers` (default: none) are passed to each forward as they
    are; `obs_shapes` (default: flat) give each module its observations as `[B, *obs_shape]`
    (`ModuleCall`). Modules missing from `modules_to_update` are passed through unchanged. A
    module's loss is `loss(call, batch[module_id])` (see `learners.losses`); `call` evaluates any
    module, so a loss may read a critic that another phase adapted, and only the module's own
    parameters are differentiated.

    Non-finite gradients (global L2 norm not finite) follow `config.nonfinite`: `skip` keeps
    that module's parameters and optimizer state exactly; `zero` replaces the non-finite
    entries by 0; `error` raises `NonFiniteGradientError` when the update ends. Under
    `error` nothing is checked per step: a non-finite gradient always leaves non-finite
    parameters behind (NaN and inf survive every later step), so one check of the result
    finds it with a single device sync per update.
    """

    def __init__(
        self,
        modules: Mapping[str, nn.Module],
        config: InnerConfig,
        losses: Mapping[str, LossFn],
        *,
        buffers: Params | None = None,
        modules_to_update: Collection[str] | None = None,
        obs_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.config = config
        self._modules = dict(modules)
        chosen = list(self._modules) if modules_to_update is None else list(modules_to_update)
        unknown = [m for m in chosen if m not in self._modules]
        if unknown or not chosen:
            raise ValueError(
                f"modules_to_update {chosen} must name at least one of the modules "
                f"{list(self._modules)}; unknown: {unknown}"
            )
        missing = [m for m in chosen if m not in losses]
        if missing:
            raise ValueError(f"no loss given for modules {missing}; losses cover {list(losses)}")
        self.modules_to_update: tuple[str, ...] = tuple(chosen)
        self._losses = {m: losses[m] for m in chosen}
        self._buffers = {m: dict((buffers or {}).get(m, {})) for m in self._modules}
        self._obs_shapes = dict(obs_shapes or {})
        self._untied = untied_modules(self._modules)
        self._optimizer = inner_optimizer(config)
        self._guarded = config.nonfinite != "error"
        # Each module differentiates its own flat dict (a nested pytree costs about 4% more
        # per step on a small MLP); the other modules' parameters enter its loss as they are.
        self._grad = torch.func.grad(self._module_loss_and_aux, has_aux=True)

    def compute_losses(self, params: Params, batch: Batch) -> dict[str, Tensor]:
        """The loss of each updated module present in `batch`, with graph."""
        return {m: self._module_loss(m, params[m], params, batch[m]) for m in self._present(batch)}

    def init_opt_state(self, params: Params) -> dict[str, OptState]:
        """Zero inner-optimizer state for every updated module."""
        return {m: self._optimizer.init(list(params[m].values())) for m in self.modules_to_update}

    def update(
        self,
        params: Params,
        batches: Batch | Iterable[Batch],
        *,
        opt_state: Mapping[str, OptState] | None = None,
        lrs: Params | None = None,
        steps: int | None = None,
        check_nonfinite: bool = True,
    ) -> UpdateResult:
        """Inner steps on one minibatch or on each minibatch of an iterable, in order.

        Each minibatch gets `steps` (default `config.steps`) consecutive steps, so
        `update(params, stream.take(n))` makes n * steps steps and consumes the iterable once.
        `lrs` are per-parameter learning rates `{module_id: {name: Tensor}}` (Meta-SGD);
        without them every parameter uses `config.lr`. A minibatch must hold at least one
        module to update; modules it lacks are not updated on that step.

        Under nonfinite='error', `check_nonfinite=False` leaves the check of the updated
        parameters to the caller (no `nonfinite` metric, nothing raised): a caller that vmaps
        this update checks the batched parameters after the call, where a vector norm costs
        a fraction of what it costs per task inside vmap.
        """
        steps = self.config.steps if steps is None else steps
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        minibatches = (batches,) if isinstance(batches, Mapping) else batches
        current = dict(params)
        state = dict(opt_state) if opt_state is not None else {}
        records: dict[str, list[tuple[Tensor, Tensor | None]]] = {}
        for batch in minibatches:
            present = self._present(batch)
            for _ in range(steps):
                # Every module steps from the same parameters: a loss that calls another
                # module sees that module as it was before this step. Losses that call other
                # modules make the gradient of a sum of losses differ from each module's
                # own, so each module differentiates its own loss.
                grads, losses = {}, {}
                for m in present:
                    # Only the other modules travel beside the differentiated dict (what grad
                    # is given costs time per call, about 2% of a small MLP's step).
                    others = {k: v for k, v in current.items() if k != m}
                    grads[m], losses[m] = self._grad(current[m], m, others, batch[m])
                for m in present:
                    rates = None if lrs is None else _module_lrs(lrs, m)
                    current[m], state[m], bad = self._step_module(
                        current[m], grads[m], state.get(m), rates
                    )
                    records.setdefault(m, []).append((losses[m].detach(), bad))
        if not records:
            raise ValueError("update() received no minibatches")
        losses_mean, metrics = {}, {}
        for m, module_records in records.items():
            losses_mean[m], metrics[m] = _summarize(module_records)
            if self.config.nonfinite == "error" and check_nonfinite:
                with torch.no_grad():
                    finite = torch.isfinite(global_norm(current[m]))
                metrics[m]["nonfinite"] = (~finite).to(losses_mean[m].dtype)
        if self.config.nonfinite == "error" and check_nonfinite and not _inside_vmap():
            raise_on_nonfinite(metrics, "the updated parameters are non-finite")
        return UpdateResult(current, losses_mean, metrics, state)

    def _present(self, batch: Batch) -> list[str]:
        present = [m for m in self.modules_to_update if m in batch]
        if not present:
            raise ValueError(
                f"the batch holds modules {sorted(batch)} but none of them is updated by this "
                f"learner (modules_to_update: {list(self.modules_to_update)})"
            )
        return present

    def _module_loss(
        self, module_id: str, own: NamedTensors, others: Params, columns: Any
    ) -> Tensor:
        """`module_id`'s loss with its parameters `own` and the other modules' in `others`."""
        params = {**others, module_id: own}
        call = ModuleCall(
            module_id,
            self._modules,
            params,
            self._buffers,
            self._obs_shapes,
            untied=self._untied,
        )
        return self._losses[module_id](call, columns)

    def _module_loss_and_aux(
        self, own: NamedTensors, module_id: str, others: Params, columns: Any
    ) -> tuple[Tensor, Tensor]:
        loss = self._module_loss(module_id, own, others, columns)
        return loss, loss

    def _step_module(
        self,
        params: NamedTensors,
        grads: NamedTensors,
        state: OptState | None,
        rates: NamedTensors | None,
    ) -> tuple[NamedTensors, OptState, Tensor | None]:
        """One module's new parameters and optimizer state, and whether its gradient was
        non-finite (None under nonfinite='error', which checks the result instead)."""
        values = list(params.values())
        # torch.func.grad returns the dict it differentiated, keys in the same order.
        gradients = list(grads.values())
        if self.config.first_order:
            gradients = [g.detach() for g in gradients]
        if state is None:
            state = self._optimizer.init(values)
        inputs = StepInputs(values, None if rates is None else [rates[n] for n in params])
        steps, state = self._optimizer.update(gradients, state, inputs)
        lr = self.config.lr if rates is None else 1.0
        new_params = dict(zip(params, descend(values, steps, lr=lr), strict=True))
        return new_params, state, ~state.finite if self._guarded else None


def raise_on_nonfinite(metrics: Mapping[str, Mapping[str, Tensor]], what: str) -> None:
    """Raise `NonFiniteGradientError` naming the first module whose `nonfinite` metric is
    non-zero (one device sync for all modules); `what` says where, `{count}` the total."""
    counts = torch.stack([m["nonfinite"].sum() for m in metrics.values()]).tolist()
    for module_id, count in zip(metrics, counts, strict=True):
        if count:
            raise NonFiniteGradientError(
                f"non-finite inner gradient for module {module_id!r}: "
                f"{what.format(count=int(count))}; lower inner.lr, "
                "set inner.clip_norm, or choose inner.nonfinite 'skip' or 'zero'"
            )


def _inside_vmap() -> bool:
    """Whether the caller runs inside `torch.func.vmap` (where a tensor cannot steer Python
    control flow, so a check that must raise has to wait until after the vmapped call), or
    is being compiled by `torch.compile`, where the same holds."""
    return torch.compiler.is_compiling() or in_vmap()


def _module_lrs(lrs: Params, module_id: str) -> NamedTensors:
    named = lrs.get(module_id)
    if named is None:
        raise ValueError(f"lrs hold no learning rates for module {module_id!r}: {sorted(lrs)}")
    return named


def _summarize(records: list[tuple[Tensor, Tensor | None]]) -> tuple[Tensor, dict[str, Tensor]]:
    """(mean loss, {loss_before, nonfinite}) over one module's steps."""
    if len(records) == 1:  # the common MAML case: nothing to stack
        loss, bad = records[0]
        metrics = {"loss_before": loss}
        if bad is not None:
            metrics["nonfinite"] = bad.to(loss.dtype)
        return loss, metrics
    losses = torch.stack([loss for loss, _ in records])
    metrics = {"loss_before": losses[0]}
    if records[0][1] is not None:
        metrics["nonfinite"] = torch.stack([bad for _, bad in records]).sum().to(losses.dtype)
    return losses.mean(), metrics
