"""MACAW's settings (`MacawConfig`) and what algorithm 'macaw' fixes in a `MetaConfig`: its two
modules' roles, heads and losses, and the authors' rates unless the config states its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from learners.models.spec import DEFAULT_MODULE_ID, ModuleSpec

if TYPE_CHECKING:
    from learners.config import MetaConfig

_STRICT = ConfigDict(extra="forbid")


class MacawConfig(BaseModel):
    """MACAW (Mitchell et al. 2021): a value function and an advantage-weighted policy.

    Defaults are the authors' released config (`config/alg/standard.json` and `src/args.py`
    of github.com/eric-mitchell/macaw) where it states them.
    """

    model_config = _STRICT

    policy: str = Field(
        DEFAULT_MODULE_ID,
        description="Module id of the policy (head mean_advantage); it trains on its own rows.",
    )
    value: str = Field(
        "value",
        description="Module id of the value function (action_dim 1); it reads the policy's rows.",
    )
    temperature: float = Field(1.0, gt=0, description="AWR temperature: weights exp(A / T).")
    max_weight: float = Field(
        20.0, gt=0, description="Largest advantage weight (exp(A / T) clipped at this value)."
    )
    normalize_advantages: bool = Field(
        True,
        description="Standardise the advantages over each task's batch before weighting "
        "(mean 0, standard deviation 1), as the paper does.",
    )
    action_std: float = Field(
        0.2, gt=0, description="Fixed standard deviation of the policy's gaussian."
    )
    advantage_head_coef: float = Field(
        0.01,
        ge=0,
        description="Weight of the advantage head's regression loss in the inner policy loss "
        "(fixed; the paper meta-learns it from this value). 0 drops the head's loss.",
    )


# Values MACAW takes from the authors' released config unless the config states its own:
# (section, field) -> value; the value function's outer rate goes to outer.module_lr.
_MACAW_DEFAULTS = {("inner", "lr"): 1e-3, ("outer", "lr"): 1e-4, ("outer", "log_lr_lr"): 1e-3}
_MACAW_VALUE_LR = 1e-5


def resolve_macaw(config: MetaConfig) -> None:
    """Check ``config``'s modules for algorithm 'macaw' and fill in its settings and rates
    (called by ``MetaConfig``'s validator, which owns ``config``)."""
    macaw = config.macaw if config.macaw is not None else MacawConfig()
    roles = {"policy": macaw.policy, "value": macaw.value}
    missing = [f"{m!r} ({role})" for role, m in roles.items() if m not in config.modules]
    if missing or macaw.policy == macaw.value:
        raise ValueError(
            f"algorithm 'macaw' needs two modules, a policy and a value function "
            f"(macaw.policy {macaw.policy!r}, macaw.value {macaw.value!r}); modules has "
            f"{sorted(config.modules)}, missing: {', '.join(missing) or 'none'}"
        )
    policy, value = config.modules[macaw.policy], config.modules[macaw.value]
    if config.modules_to_update is not None and set(config.modules_to_update) != set(
        roles.values()
    ):
        raise ValueError(
            f"algorithm 'macaw' trains its policy and value function together; "
            f"modules_to_update is {config.modules_to_update}: drop it"
        )
    default_loss = ModuleSpec.model_fields["loss"].default
    with_loss = {m: config.modules[m].loss for m in roles.values()}
    with_loss = {m: loss for m, loss in with_loss.items() if loss != default_loss}
    if with_loss:
        raise ValueError(
            f"algorithm 'macaw' sets the losses of its modules itself (value regression to "
            f"returns, advantage-weighted regression); got losses {with_loss}: drop them"
        )
    if policy.model.head != "mean_advantage":
        raise ValueError(
            f"algorithm 'macaw': the policy module {macaw.policy!r} has head "
            f"{policy.model.head!r}; expected head 'mean_advantage'"
        )
    if value.action_dim != 1 or value.model.head != "deterministic":
        raise ValueError(
            f"algorithm 'macaw': the value module {macaw.value!r} must output one number "
            f"(action_dim 1, head 'deterministic'), got action_dim {value.action_dim}, "
            f"head {value.model.head!r}"
        )
    if value.data_module not in (None, macaw.policy) or policy.data_module is not None:
        raise ValueError(
            f"algorithm 'macaw': the value module reads the policy's rows and the policy "
            f"its own; got data_module {value.data_module!r} for {macaw.value!r} and "
            f"{policy.data_module!r} for {macaw.policy!r}"
        )
    modules = dict(config.modules)
    modules[macaw.value] = value.model_copy(update={"data_module": macaw.policy})
    config.modules = modules
    config.macaw = macaw
    for (section, name), default in _MACAW_DEFAULTS.items():
        part = getattr(config, section)
        if name not in part.model_fields_set:
            setattr(config, section, part.model_copy(update={name: default}))
    if "module_lr" not in config.outer.model_fields_set:
        module_lr = {macaw.value: _MACAW_VALUE_LR}
        config.outer = config.outer.model_copy(update={"module_lr": module_lr})
