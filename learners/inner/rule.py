"""What an algorithm adapts on a task's support set, in which order, and what it meta-learns.

An `InnerRule` is a sequence of phases (`DifferentiableLearner`s over some modules, or an
algorithm's own, such as the context learner's encoding), run one after the other: each
phase starts from the parameters the previous one returned, so a later phase's losses see the
modules an earlier one adapted. The outer losses (the meta-objective on the query set) may
differ from the inner ones. Which phases and losses is the algorithm's (`learners.algorithms`,
asked through its registry); this module only runs them.

Every batch enters the learner through `expand` (meta-steps eager and compiled, evaluation,
`adapt`): modules with a `data_module` get that module's rows, and the columns of
`MetaConfig.column_stats` (rewards, returns) are standardised, before any loss or encoder
sees the batch. So a consumer's support set, like the training data, is given raw.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor, nn

from learners.algorithms.catalog import algorithm_for
from learners.algorithms.registry import Phase, RuleBuilders
from learners.config import MetaConfig
from learners.inner.differentiable import DifferentiableLearner
from learners.losses import LossFn, ModuleCall, resolve_loss, untied_modules
from learners.params import Batch, Params


@dataclass(frozen=True)
class InnerRule:
    """The phases of an algorithm's inner loop and the losses of its outer loop."""

    phases: tuple[Phase, ...]
    """Run in order on the support set, `steps` inner steps each."""
    outer: Phase
    """Only its losses are used: the meta-objective on the query set, per module."""
    data_module: dict[str, str]
    """Module -> the module whose rows it reads, for the modules that read another's."""
    column_stats: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Column -> (mean, std) it is standardised with."""

    def expand(self, batch: Batch) -> dict[str, Mapping[str, Tensor]]:
        """`batch` with its `column_stats` columns standardised and every reading module
        given its data module's columns."""
        expanded = {m: self._standardized(columns) for m, columns in batch.items()}
        for module_id, source in self.data_module.items():
            if source in batch:
                expanded[module_id] = expanded[source]
        return expanded

    def _standardized(self, columns: Mapping[str, Tensor]) -> Mapping[str, Tensor]:
        if not any(name in columns for name in self.column_stats):
            return columns
        scaled = dict(columns)
        for name, (mean, std) in self.column_stats.items():
            if name in scaled:
                scaled[name] = (scaled[name] - mean) / std
        return scaled

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

    untied = untied_modules(models)

    def learner(losses: Mapping[str, LossFn]) -> DifferentiableLearner:
        return DifferentiableLearner(
            models,
            config.inner,
            losses,
            buffers=buffers,
            modules_to_update=list(losses),
            obs_shapes=obs_shapes,
        )

    def call(module_id: str, params: Params) -> ModuleCall:
        return ModuleCall(module_id, models, params, buffers, obs_shapes, untied=untied)

    def loss(module_id: str) -> LossFn:
        return resolve_loss(config.modules[module_id].loss)

    builders = RuleBuilders(learner=learner, call=call, loss=loss)
    phases = algorithm_for(config.algorithm).phases(config, builders)
    column_stats = {c: (stats.mean[0], stats.std[0]) for c, stats in config.column_stats.items()}
    return InnerRule(phases.inner, phases.outer, data_module, column_stats)
