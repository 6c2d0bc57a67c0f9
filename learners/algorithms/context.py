"""The context-encoder learner, registered as 'context': its settings and what it fixes in a
config are `learners.algorithms.context_config`, its phase and losses
`learners.algorithms.context_phase`.
"""

from __future__ import annotations

from typing import Any

from learners.algorithms.context_config import ContextConfig, resolve_context
from learners.algorithms.registry import (
    ComposedInput,
    ConfigView,
    Phases,
    Resolution,
    RuleBuilders,
    inner_flags,
    register_algorithm,
)


class Context:
    """Algorithm 'context' (registered below)."""

    names = ("context",)
    section = "context"

    def resolve(self, view: ConfigView) -> Resolution:
        inner = inner_flags(
            view,
            first_order=None,
            learned_lrs=("none",),
            default_lr="none",
            hint="the context learner adapts by encoding, without inner learning rates",
        )
        assert view.section is None or isinstance(view.section, ContextConfig)
        context, modules = resolve_context(view.section, view.modules, view.modules_to_update)
        return Resolution(context, modules, inner, {})

    def sample_columns(self, config: Any) -> tuple[str, ...]:
        context: ContextConfig = config.context
        needed = ["obs", "actions", *context.fields]
        if context.value is not None:
            needed.append("returns")
        if context.task_model is not None:
            needed += ["rewards", "new_obs"]
        return tuple(dict.fromkeys(needed))

    def phases(self, config: Any, build: RuleBuilders) -> Phases:
        # Imported here: the config side of every algorithm (this module) stays free of torch,
        # which flows/config.py must not import.
        from learners.algorithms.context_phase import context_phases

        policy = config.modules[config.context.policy]
        return context_phases(config.context, build, policy.input_stats)

    def rollout_module(self, config: Any) -> str:
        return config.context.policy

    def observing_modules(self, config: Any) -> list[str]:
        context: ContextConfig = config.context
        return [m for m in (context.policy, context.value) if m is not None]

    def composed_inputs(self, config: Any) -> dict[str, ComposedInput]:
        context: ContextConfig = config.context
        policy = config.modules[context.policy]
        sizes = {"obs": policy.obs_dim, "new_obs": policy.obs_dim, "actions": policy.action_dim}
        transition = tuple((name, sizes.get(name, 1)) for name in context.fields)
        inputs = {context.encoder: ComposedInput(transition, context.standardize_transitions)}
        if context.task_model is not None:
            inputs[context.task_model] = ComposedInput(
                (("obs", policy.obs_dim), ("actions", policy.action_dim)), True
            )
        return inputs

    def compile_unsupported(self, config: Any) -> str | None:
        return None


register_algorithm(Context())
