"""MACAW's settings (`MacawConfig`) and what algorithm 'macaw' fixes in a `MetaConfig`: its two
modules' roles, heads and losses, and the authors' rates unless the config states its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from learners.models.spec import DEFAULT_MODULE_ID, ModuleSpec

_STRICT = ConfigDict(extra="forbid")


class AdvantageWeighting(BaseModel):
    """How advantage-weighted regression weights a policy's rows (Peng et al. 2019, as MACAW
    uses it): `exp(A / temperature)` clipped at `max_weight`, under a gaussian of fixed
    standard deviation."""

    model_config = _STRICT

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


class MacawConfig(AdvantageWeighting):
    """MACAW (Mitchell et al. 2021): a value function and an advantage-weighted policy.

    Defaults are the authors' released config (`config/alg/standard.json` and `src/args.py`
    of github.com/eric-mitchell/macaw) where it states them.
    """

    policy: str = Field(
        DEFAULT_MODULE_ID,
        description="Module id of the policy (head mean_advantage); it trains on its own rows.",
    )
    value: str = Field(
        "value",
        description="Module id of the value function (action_dim 1); it reads the policy's rows.",
    )
    advantage_head_coef: float = Field(
        0.01,
        ge=0,
        description="Weight of the advantage head's regression loss in the inner policy loss "
        "(fixed; the paper meta-learns it from this value). 0 drops the head's loss.",
    )


# Values MACAW takes from the authors' released config unless the config states its own, per
# section; the value function's outer rate goes to outer.module_lr.
_MACAW_DEFAULTS = {"inner": {"lr": 1e-3}, "outer": {"lr": 1e-4, "log_lr_lr": 1e-3}}
_MACAW_VALUE_LR = 1e-5


class MacawResolution(NamedTuple):
    """What algorithm 'macaw' fixes in a `MetaConfig`: the values its fields take."""

    macaw: MacawConfig
    """The macaw section, defaults filled in."""
    modules: dict[str, ModuleSpec]
    """The modules, the value function reading the policy's rows."""
    inner: dict[str, Any]
    """Fields of the inner section to set (the authors' rates the config does not state)."""
    outer: dict[str, Any]
    """Fields of the outer section to set, likewise."""


def resolve_macaw(
    macaw: MacawConfig | None,
    modules: Mapping[str, ModuleSpec],
    modules_to_update: list[str] | None,
    given: Mapping[str, AbstractSet[str]],
) -> MacawResolution:
    """Check a `MetaConfig`'s `modules` (and `modules_to_update`) for algorithm 'macaw' and
    return the values it fixes; `given` names the fields the config states, per section
    ('inner', 'outer'). Nothing passed in is changed."""
    macaw = macaw if macaw is not None else MacawConfig()
    roles = {"policy": macaw.policy, "value": macaw.value}
    missing = [f"{m!r} ({role})" for role, m in roles.items() if m not in modules]
    if missing or macaw.policy == macaw.value:
        raise ValueError(
            f"algorithm 'macaw' needs two modules, a policy and a value function "
            f"(macaw.policy {macaw.policy!r}, macaw.value {macaw.value!r}); modules has "
            f"{sorted(modules)}, missing: {', '.join(missing) or 'none'}"
        )
    policy, value = modules[macaw.policy], modules[macaw.value]
    if modules_to_update is not None and set(modules_to_update) != set(roles.values()):
        raise ValueError(
            f"algorithm 'macaw' trains its policy and value function together; "
            f"modules_to_update is {modules_to_update}: drop it"
        )
    default_loss = ModuleSpec.model_fields["loss"].default
    with_loss = {m: modules[m].loss for m in roles.values()}
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
    resolved_modules = dict(modules)
    resolved_modules[macaw.value] = value.model_copy(update={"data_module": macaw.policy})
    sections = {
        section: {name: v for name, v in defaults.items() if name not in given[section]}
        for section, defaults in _MACAW_DEFAULTS.items()
    }
    if "module_lr" not in given["outer"]:
        sections["outer"]["module_lr"] = {macaw.value: _MACAW_VALUE_LR}
    return MacawResolution(macaw, resolved_modules, sections["inner"], sections["outer"])
