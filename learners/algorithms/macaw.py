"""MACAW (Mitchell et al. 2021, "Offline Meta-Reinforcement Learning with Advantage
Weighting"), registered as 'macaw': its settings are `MacawConfig`
(`learners.algorithms.macaw_config`), its losses `learners.algorithms.macaw_losses`.
"""

from __future__ import annotations

from typing import Any

from learners.algorithms.macaw_config import MacawConfig, resolve_macaw
from learners.algorithms.registry import (
    LEARNED_LRS,
    ComposedInput,
    ConfigView,
    Phases,
    Resolution,
    RuleBuilders,
    inner_flags,
    register_algorithm,
)


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
        # Imported here: the config side of every algorithm (this module) stays free of torch,
        # which flows/config.py must not import.
        from learners.algorithms.macaw_losses import (
            AdvantageWeightedRegression,
            value_regression_loss,
        )

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

    def observing_modules(self, config: Any) -> list[str]:
        return list(config.modules)

    def composed_inputs(self, config: Any) -> dict[str, ComposedInput]:
        return {}

    def compile_unsupported(self, config: Any) -> str | None:
        # Not yet verified against eager: its phases compiled for minutes and drifted beyond
        # float64 rounding from the eager step.
        return "algorithm 'macaw' (two inner phases) runs eager; compile covers one"


register_algorithm(Macaw())
