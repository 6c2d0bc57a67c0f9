"""The context learner's settings (`ContextConfig`) and what algorithm 'context' fixes in a
`MetaConfig`: its modules' roles, the latent they are conditioned on, the encoder's input
size, and the modules that read the policy's rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, field_validator

from learners.algorithms.macaw_config import AdvantageWeighting
from learners.models.spec import DEFAULT_MODULE_ID, ModuleSpec

Field_ = Literal["obs", "actions", "rewards", "new_obs", "returns"]


class ContextConfig(AdvantageWeighting):
    """A context-encoder learner (task inference as in PEARL, Rakelly et al. 2019, and the
    offline FOCAL, Li et al. 2021): a permutation-invariant encoder maps each support
    transition to a code; the codes' mean, pooled with a learned prior as one more element,
    is the task latent; the policy (and with `value`, a value function) reads
    `[obs, latent]`. Trained end to end on the query set: the policy's configured loss, or
    with `value` advantage-weighted regression (the fields inherited here) plus the value's
    regression to returns; with `task_model`, plus `task_model_coef` times a model's squared
    error predicting `[reward, next obs]` from `[obs, action, latent]`.

    The latent of an empty context (zero transitions) is each conditioned module's own prior
    `latent` parameter: what "unadapted" means for this learner.
    """

    policy: str = Field(
        DEFAULT_MODULE_ID, description="Module id of the policy; it trains on its own rows."
    )
    encoder: str = Field(
        "encoder",
        description="Module id of the encoder: obs_dim the size of one transition's `fields` "
        "concatenated, action_dim latent_dim; it reads the policy's rows.",
    )
    value: str | None = Field(
        None,
        description="Module id of a value function (action_dim 1) regressing returns; with it "
        "the policy's loss is advantage-weighted regression (offline RL). None: the policy's "
        "own loss (imitation).",
    )
    task_model: str | None = Field(
        None,
        description="Module id of an auxiliary task model (obs_dim obs + action sizes, "
        "action_dim 1 + obs size) predicting [reward, next obs]. None: no auxiliary loss.",
    )
    latent_dim: int = Field(8, ge=1, description="Size of the task latent.")
    fields: tuple[Field_, ...] = Field(
        ("obs", "actions", "rewards", "new_obs"),
        description="The columns of one transition the encoder reads, concatenated in this "
        "order (rewards and returns count one value each).",
    )
    task_model_coef: float = Field(
        1.0, ge=0, description="Weight of the task model's loss in the meta-objective."
    )
    standardize_transitions: bool = Field(
        True,
        description="With data.normalize [obs]: the encoder standardises the observations "
        "inside its transitions (obs, new_obs) with the statistics the policy's are "
        "standardised with (rewards and returns as data.normalize names them); false: the "
        "encoder reads its transitions' observations raw.",
    )

    @field_validator("fields")
    @classmethod
    def _distinct_fields(cls, fields: tuple[str, ...]) -> tuple[str, ...]:
        if not fields or len(set(fields)) != len(fields):
            raise ValueError(f"fields must name distinct columns, at least one; got {fields}")
        return fields

    def roles(self) -> dict[str, str]:
        """Role -> module id, for the roles in use."""
        named = {"policy": self.policy, "encoder": self.encoder}
        named |= {"value": self.value, "task_model": self.task_model}
        return {role: m for role, m in named.items() if m is not None}


def encoder_input_size(context: ContextConfig, policy: ModuleSpec) -> int:
    """The size of one transition's `fields`, concatenated."""
    sizes = {"obs": policy.obs_dim, "new_obs": policy.obs_dim, "actions": policy.action_dim}
    return sum(sizes.get(name, 1) for name in context.fields)


def resolve_context(
    context: ContextConfig | None,
    modules: Mapping[str, ModuleSpec],
    modules_to_update: list[str] | None,
) -> tuple[ContextConfig, dict[str, ModuleSpec]]:
    """Check a `MetaConfig`'s modules for algorithm 'context'; return the section with its
    defaults and the modules it fixes (latent sizes, the rows they read). Nothing passed in
    is changed."""
    context = context if context is not None else ContextConfig()
    roles = context.roles()
    if len(set(roles.values())) != len(roles) or set(roles.values()) != set(modules):
        raise ValueError(
            f"algorithm 'context' needs one module per role {roles}; modules has "
            f"{sorted(modules)}: name each module in the context section, once"
        )
    if modules_to_update is not None and set(modules_to_update) != set(modules):
        raise ValueError(
            f"algorithm 'context' trains its modules together; modules_to_update is "
            f"{modules_to_update}: drop it"
        )
    policy = modules[context.policy]
    _check_spec(context, "policy", policy, policy.obs_dim, policy.action_dim)
    if "actions" in context.fields and policy.model.head == "categorical":
        raise ValueError(
            "algorithm 'context' encodes continuous actions; the policy has head "
            "'categorical': drop 'actions' from context.fields"
        )
    width = encoder_input_size(context, policy)
    sizes = {"encoder": (width, context.latent_dim), "value": (policy.obs_dim, 1)}
    sizes["task_model"] = (policy.obs_dim + policy.action_dim, 1 + policy.obs_dim)
    resolved = dict(modules)
    for role, module_id in roles.items():
        spec = modules[module_id]
        if role != "policy":
            _check_spec(context, role, spec, *sizes[role])
            if spec.loss != ModuleSpec.model_fields["loss"].default:
                raise ValueError(
                    f"algorithm 'context' sets the loss of its {role} {module_id!r} itself; "
                    f"got loss {spec.loss!r}: drop it"
                )
        allowed = (None,) if role == "policy" else (None, context.policy)
        if spec.data_module not in allowed:
            raise ValueError(
                f"algorithm 'context': every module reads the policy's rows; module "
                f"{module_id!r} has data_module {spec.data_module!r}: drop it"
            )
        update: dict[str, object] = {}
        if role != "encoder":
            update["latent_dim"] = context.latent_dim
        if role != "policy":
            update["data_module"] = context.policy
        resolved[module_id] = spec.model_copy(update=update)
    weighted = context.value is not None and policy.model.factory is None
    if weighted and policy.model.head not in ("gaussian", "mean_advantage"):
        raise ValueError(
            f"algorithm 'context' with a value function weights the policy's gaussian "
            f"log-likelihood; the policy has head {policy.model.head!r}: use head 'gaussian'"
        )
    return context, resolved


def _check_spec(
    context: ContextConfig, role: str, spec: ModuleSpec, obs_dim: int, action_dim: int
) -> None:
    if spec.latent_dim not in (0, context.latent_dim) or (role == "encoder" and spec.latent_dim):
        expected = 0 if role == "encoder" else context.latent_dim
        raise ValueError(
            f"algorithm 'context': the {role}'s latent_dim is {spec.latent_dim}, expected "
            f"{expected} (context.latent_dim sets it): drop latent_dim"
        )
    if len(spec.observation_shape) != 1:
        raise ValueError(
            f"algorithm 'context' reads flat observations; the {role} has obs_shape "
            f"{list(spec.observation_shape)}"
        )
    if (spec.obs_dim, spec.action_dim) != (obs_dim, action_dim):
        raise ValueError(
            f"algorithm 'context': the {role} needs obs_dim {obs_dim} and action_dim "
            f"{action_dim}, got {spec.obs_dim} and {spec.action_dim}"
        )
