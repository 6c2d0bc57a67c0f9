"""What an algorithm adapts on a task's support set, in which order, and what it meta-learns.

An `InnerRule` is a sequence of phases, each a `DifferentiableLearner` over some modules, run
one after the other: each phase starts from the parameters the previous one returned, so a
later phase's losses see the modules an earlier one adapted. The outer losses (the
meta-objective on the query set) may differ from the inner ones.

- maml, fomaml, metasgd: one phase over every trained module; outer losses = inner losses.
- macaw: the value function first (regression to returns), then the policy (advantage-weighted
  regression with the adapted value function, plus the advantage head's loss); outer: value
  regression and advantage-weighted regression without the head's loss.

Modules with a `data_module` read that module's rows: `expand` copies them in before any loss
sees the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import Tensor, nn

from learners.algorithms.macaw import AdvantageWeightedRegression, value_regression_loss
from learners.config import MetaConfig
from learners.inner.differentiable import DifferentiableLearner
from learners.losses import LossFn, resolve_loss
from learners.params import Batch, Params


@dataclass(frozen=True)
class InnerRule:
    """The phases of an algorithm's inner loop and the losses of its outer loop."""

    phases: tuple[DifferentiableLearner, ...]
    """Run in order on the support set, `steps` inner steps each."""
    outer: DifferentiableLearner
    """Only its losses are used: the meta-objective on the query set, per module."""
    data_module: dict[str, str]
    """Module -> the module whose rows it reads, for the modules that read another's."""

    def expand(self, batch: Batch) -> dict[str, Mapping[str, Tensor]]:
        """`batch` with every reading module given its data module's columns."""
        expanded = dict(batch)
        for module_id, source in self.data_module.items():
            if source in batch:
                expanded[module_id] = batch[source]
        return expanded

    def adapt(
        self,
        params: Params,
        support: Batch,
        *,
        lrs: Params | None,
        steps: int | None = None,
        check_nonfinite: bool = True,
    ) -> tuple[Params, dict[str, dict[str, Tensor]]]:
        """Parameters after every phase on an expanded `support` batch, and each updated
        module's inner metrics (`loss_before`, `nonfinite`; see
        `DifferentiableLearner.update` for `check_nonfinite`)."""
        metrics: dict[str, dict[str, Tensor]] = {}
        for phase in self.phases:
            result = phase.update(
                params, support, lrs=lrs, steps=steps, check_nonfinite=check_nonfinite
            )
            params = result.params
            metrics.update(result.metrics)
        return params, metrics

    def inner_losses(self, params: Params, batch: Batch) -> dict[str, Tensor]:
        """Each phase's losses of its modules on an expanded batch."""
        losses: dict[str, Tensor] = {}
        for phase in self.phases:
            losses.update(phase.compute_losses(params, batch))
        return losses

    def outer_losses(self, params: Params, batch: Batch) -> dict[str, Tensor]:
        """The meta-objective's loss of each trained module on an expanded batch."""
        return self.outer.compute_losses(params, batch)


def build_inner_rule(
    config: MetaConfig, models: Mapping[str, nn.Module], buffers: Params
) -> InnerRule:
    """The inner rule `config.algorithm` describes, over `models`."""
    data_module = {
        m: spec.data_module for m, spec in config.modules.items() if spec.data_module is not None
    }

    obs_shapes = {m: spec.observation_shape for m, spec in config.modules.items()}

    def learner(losses: Mapping[str, LossFn]) -> DifferentiableLearner:
        return DifferentiableLearner(
            models,
            config.inner,
            losses,
            buffers=buffers,
            modules_to_update=list(losses),
            obs_shapes=obs_shapes,
        )

    phases, outer = _PHASES.get(config.algorithm, _one_phase)(config, learner)
    return InnerRule(phases, outer, data_module)


Learner = Callable[[Mapping[str, LossFn]], DifferentiableLearner]


def _one_phase(
    config: MetaConfig, learner: Learner
) -> tuple[tuple[DifferentiableLearner, ...], DifferentiableLearner]:
    """Every trained module adapts at once with its configured loss, inside and outside."""
    single = learner({m: resolve_loss(config.modules[m].loss) for m in config.trained_modules})
    return (single,), single


def _macaw_phases(
    config: MetaConfig, learner: Learner
) -> tuple[tuple[DifferentiableLearner, ...], DifferentiableLearner]:
    macaw = config.macaw
    assert macaw is not None  # MetaConfig fills it in for algorithm macaw
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
    phases = (
        learner({macaw.value: value_regression_loss}),
        learner({macaw.policy: inner_policy}),
    )
    return phases, learner({macaw.value: value_regression_loss, macaw.policy: outer_policy})


_PHASES = {"macaw": _macaw_phases}
"""Algorithms whose inner loop is not a single phase with the configured losses."""
