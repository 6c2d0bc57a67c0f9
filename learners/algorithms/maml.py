"""The MAML family: gradient steps on the support set with each module's configured loss,
the same loss on the query set as the meta-objective.

- maml: second-order MAML (Finn et al. 2017, "Model-Agnostic Meta-Learning for Fast
  Adaptation of Deep Networks"): the meta-gradient differentiates through the inner steps.
- fomaml: first-order MAML (same paper): the inner gradients are detached
  (`inner.first_order`).
- metasgd: Meta-SGD (Li et al. 2017): the inner learning rates are meta-learned too
  (`inner.learned_lr`: per module, tensor or element; element by default).

No config section of its own: the family sets `inner.first_order` and `inner.learned_lr`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class MamlVariant:
    """One member of the family: the inner flags its name implies."""

    name: str
    first_order: bool | None
    """None: the config's own `inner.first_order` (Meta-SGD runs either way)."""
    learned_lrs: tuple[str, ...]
    default_lr: str
    section: None = None

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name,)

    def resolve(self, view: ConfigView) -> Resolution:
        hint = "pick one" if self.learned_lrs != ("none",) else "use algorithm 'metasgd'"
        inner = inner_flags(
            view,
            first_order=self.first_order,
            learned_lrs=self.learned_lrs,
            default_lr=self.default_lr,
            hint=hint,
        )
        return Resolution(None, dict(view.modules), inner, {})

    def sample_columns(self, config: Any) -> tuple[str, ...]:
        # The configured losses name their own columns (a user loss may read any).
        return ("obs",)

    def phases(self, config: Any, build: RuleBuilders) -> Phases:
        """Every trained module adapts at once with its configured loss, inside and outside."""
        single = build.learner({m: build.loss(m) for m in config.trained_modules})
        return Phases((single,), single)

    def rollout_module(self, config: Any) -> str:
        """The one module that reads its own rows."""
        (module,) = config.data_modules
        return module

    def observing_modules(self, config: Any) -> list[str]:
        return list(config.modules)

    def composed_inputs(self, config: Any) -> dict[str, ComposedInput]:
        return {}

    def compile_unsupported(self, config: Any) -> str | None:
        return None


register_algorithm(MamlVariant("maml", False, ("none",), "none"))
register_algorithm(MamlVariant("fomaml", True, ("none",), "none"))
register_algorithm(MamlVariant("metasgd", None, LEARNED_LRS[1:], "element"))
