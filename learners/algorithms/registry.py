"""The protocol every algorithm family meets, and the registry that is the one place an
algorithm's name is matched.

An algorithm is one module of this room (STYLE.md point 19): its config section, what it
fixes in a `MetaConfig`, the columns it reads from a task sample, its inner phases and outer
losses, which module evaluation rolls out, and one `register_algorithm(...)` line at its
bottom. The rest of the code asks `algorithm_for(name)`; `learners.algorithms.catalog` imports
every family, so the registry is complete once it is imported.

Nothing here imports the learners' config or the inner learner (they import this room): the
config side of an algorithm sees the sections as it is given them, and the learner side builds
its phases with the builders `learners.inner.rule` passes in (`RuleBuilders`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from pydantic import BaseModel

from learners.models.spec import ModuleSpec

if TYPE_CHECKING:  # the config side imports this module and must stay free of torch
    from torch import Tensor

    from learners.losses import LossFn, ModuleCall
    from learners.params import Batch, Params

LEARNED_LRS = ("none", "scalar", "tensor", "element")
"""Every value of `inner.learned_lr`."""


class ConfigView(NamedTuple):
    """What an algorithm resolves, as the `MetaConfig` being validated holds it."""

    name: str
    """The name the config gave (a family may answer to several: maml, fomaml, metasgd)."""
    section: BaseModel | None
    """The algorithm's own config section as given (None: not given)."""
    modules: Mapping[str, ModuleSpec]
    modules_to_update: list[str] | None
    inner: BaseModel
    """The inner section as given (`InnerConfig`)."""
    given: Mapping[str, AbstractSet[str]]
    """The fields the config states, per section ('inner', 'outer')."""


class Resolution(NamedTuple):
    """What an algorithm fixes in a `MetaConfig`: the values its fields take."""

    section: BaseModel | None
    """The algorithm's section, defaults filled in (None for a family without one)."""
    modules: dict[str, ModuleSpec]
    inner: dict[str, Any]
    """Fields of the inner section to set."""
    outer: dict[str, Any]
    """Fields of the outer section to set."""


class PhaseResult(Protocol):
    """What a phase's `update` gives back (`DifferentiableLearner.update`'s `UpdateResult`)."""

    @property
    def params(self) -> Params: ...

    @property
    def metrics(self) -> dict[str, dict[str, Tensor]]: ...


class Phase(Protocol):
    """One step of an inner loop: a `DifferentiableLearner`, or an algorithm's own."""

    def update(
        self,
        params: Params,
        batches: Batch,
        *,
        lrs: Params | None = None,
        steps: int | None = None,
        check_nonfinite: bool = True,
    ) -> PhaseResult: ...

    def compute_losses(self, params: Params, batch: Batch) -> dict[str, Tensor]: ...


class RuleBuilders(NamedTuple):
    """What `learners.inner.rule` hands an algorithm to build its phases with."""

    learner: Callable[[Mapping[str, LossFn]], Phase]
    """A `DifferentiableLearner` updating the modules `losses` names, with those losses."""
    call: Callable[[str, Params], ModuleCall]
    """`call(module_id, params)`: a `ModuleCall` for that module over `params`."""
    loss: Callable[[str], LossFn]
    """A module's configured loss (`ModuleSpec.loss`) as a function."""


class Phases(NamedTuple):
    """An algorithm's inner loop and meta-objective."""

    inner: tuple[Phase, ...]
    """Run in order on the support set, each from the parameters the previous returned."""
    outer: Phase
    """Only its losses are used: the meta-objective on the query set, per module."""


class ComposedInput(NamedTuple):
    """A module's first input made of batch columns concatenated (an encoder of
    transitions)."""

    parts: tuple[tuple[str, int], ...]
    """``(column, width)`` of each part, in order."""
    standardized: bool
    """Whether ``data.normalize`` standardises each part as its column; the observation
    features ``data.ignore_obs_features`` names are ignored in its observation parts
    either way."""


class Algorithm(Protocol):
    """One algorithm family (module docstring). `config` arguments are the `MetaConfig`."""

    names: tuple[str, ...]
    """The names `learners.algorithm` accepts for this family."""
    section: str | None
    """The `MetaConfig` field holding the family's own settings (None: it has none)."""

    def resolve(self, view: ConfigView) -> Resolution:
        """Check the config for this algorithm and return what it fixes; nothing given is
        changed. Raise `ValueError` with one line naming the key and what was expected."""
        ...

    def sample_columns(self, config: Any) -> tuple[str, ...]:
        """The columns every task sample of the rolled-out module must hold."""
        ...

    def phases(self, config: Any, build: RuleBuilders) -> Phases:
        """The inner phases and the outer losses over the config's modules."""
        ...

    def rollout_module(self, config: Any) -> str:
        """The module evaluation rolls out in an environment (the policy)."""
        ...

    def observing_modules(self, config: Any) -> list[str]:
        """The modules whose input is one observation of the data (`obs_dim` its size); the
        others read something the algorithm builds (an encoder reads whole transitions)."""
        ...

    def composed_inputs(self, config: Any) -> dict[str, ComposedInput]:
        """The modules whose first input is batch columns concatenated (an encoder of
        transitions), each with its parts in order and whether `data.normalize`
        standardises each part as its column (observations and next observations with the
        observations' statistics)."""
        ...

    def compile_unsupported(self, config: Any) -> str | None:
        """Why the compiled meta-step cannot run this configuration (None: it can)."""
        ...


_REGISTRY: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm) -> Algorithm:
    """Add a family under each of its names (once: a name taken twice is refused)."""
    for name in algorithm.names:
        if name in _REGISTRY:
            raise ValueError(f"algorithm name {name!r} is registered twice")
        _REGISTRY[name] = algorithm
    return algorithm


def registered_names() -> tuple[str, ...]:
    """Every registered algorithm name, sorted (whichever module was imported first)."""
    return tuple(sorted(_REGISTRY))


def registered_algorithms() -> tuple[Algorithm, ...]:
    """Every registered family once, in the order of its first name."""
    return tuple({id(_REGISTRY[n]): _REGISTRY[n] for n in registered_names()}.values())


def algorithm_for(name: str) -> Algorithm:
    """The family registered under `name`."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown algorithm {name!r}: expected one of {list(registered_names())}")
    return _REGISTRY[name]


def inner_flags(
    view: ConfigView,
    *,
    first_order: bool | None,
    learned_lrs: Iterable[str],
    default_lr: str,
    hint: str,
) -> dict[str, Any]:
    """The inner fields an algorithm implies: `first_order` (None: the config's choice) and
    `learned_lr` (one of `learned_lrs`, `default_lr` when not given); `hint` ends the refusal
    of a `learned_lr` outside them."""
    allowed = list(learned_lrs)
    given = view.given["inner"]
    inner: dict[str, Any] = {}
    if first_order is not None:
        if "first_order" in given and view.inner.first_order != first_order:
            other = "fomaml" if first_order is False else "maml"
            raise ValueError(
                f"algorithm {view.name!r} sets inner.first_order={first_order}; "
                f"choose {other} instead, or drop inner.first_order"
            )
        inner["first_order"] = first_order
    learned_lr = view.inner.learned_lr
    if "learned_lr" not in given:
        inner["learned_lr"] = default_lr
    elif learned_lr not in allowed:
        raise ValueError(
            f"algorithm {view.name!r} needs inner.learned_lr in {allowed}, "
            f"got {learned_lr!r}; {hint}"
        )
    return inner
