"""Typed configuration of the learners: one pydantic model per concern, every field documented.

`MetaConfig` is the whole learner (it is saved inside every learner state and nests in the
flow's run config); `InnerConfig` alone configures a `DifferentiableLearner`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from learners.algorithms.catalog import algorithm_for, registered_algorithms, registered_names
from learners.algorithms.context_config import ContextConfig
from learners.algorithms.macaw_config import MacawConfig
from learners.algorithms.registry import ComposedInput, ConfigView
from learners.models.spec import DEFAULT_MODULE_ID, InputStats, ModelConfig, ModuleSpec

__all__ = [
    "DEFAULT_MODULE_ID",
    "ContextConfig",
    "InnerConfig",
    "MacawConfig",
    "MetaConfig",
    "ModelConfig",
    "ModuleSpec",
    "OuterConfig",
]

_STRICT = ConfigDict(extra="forbid")


class InnerConfig(BaseModel):
    """The inner (task-adaptation) update rule, shared by training, `adapt` and `evaluate`."""

    model_config = _STRICT

    lr: float = Field(0.01, gt=0, description="Inner learning rate (initial value if learned).")
    steps: int = Field(1, ge=1, description="Inner steps per minibatch.")
    optimizer: Literal["sgd", "momentum", "adam"] = Field(
        "sgd", description="Functional, differentiable inner optimizer."
    )
    momentum: float = Field(0.9, ge=0, lt=1, description="Heavy-ball coefficient (momentum).")
    betas: tuple[float, float] = Field(
        (0.9, 0.999), description="Adam decay rates of the first and second moments."
    )
    eps: float = Field(1e-8, gt=0, description="Adam denominator term.")
    eps_root: float = Field(
        1e-16,
        ge=0,
        description=(
            "Added under Adam's square root so that its derivative stays finite where a "
            "gradient is exactly zero (second-order meta-gradients would be NaN otherwise)."
        ),
    )
    first_order: bool = Field(
        False, description="Detach inner gradients (first-order MAML); set by the algorithm."
    )
    learned_lr: Literal["none", "scalar", "tensor", "element"] = Field(
        "none",
        description=(
            "Meta-learned inner learning rates, kept in log space: one per module (scalar), "
            "per parameter tensor (tensor) or per parameter element (element). Set by the "
            "algorithm; the inner learner receives them through `update(..., lrs=...)`."
        ),
    )
    clip_norm: float | None = Field(
        None, gt=0, description="Clip each module's inner gradient to this global norm."
    )
    nonfinite: Literal["error", "skip", "zero"] = Field(
        "error",
        description=(
            "Non-finite inner gradient: error raises NonFiniteGradientError; skip leaves that "
            "module's parameters and optimizer state exactly as they were; zero replaces the "
            "non-finite entries by 0 and steps."
        ),
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, betas: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= beta < 1 for beta in betas):
            raise ValueError(f"both betas must lie in [0, 1), got {list(betas)}")
        return betas


class OuterConfig(BaseModel):
    """The outer (meta) optimizer over meta-parameters and learned learning rates."""

    model_config = _STRICT

    optimizer: Literal["adam", "sgd"] = Field("adam", description="torch.optim optimizer.")
    lr: float = Field(1e-3, gt=0, description="Outer learning rate.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="Adam betas.")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum.")
    weight_decay: float = Field(0.0, ge=0, description="L2 penalty of the outer optimizer.")
    clip_norm: float | None = Field(
        None, gt=0, description="Clip the meta-gradient to this global norm before stepping."
    )
    nonfinite: Literal["error", "skip"] = Field(
        "error",
        description=(
            "Non-finite meta-gradient: error raises NonFiniteGradientError; skip leaves the "
            "meta-parameters, the optimizer and weights_seq_no unchanged."
        ),
    )
    module_lr: dict[str, float] = Field(
        default_factory=dict,
        description="Outer learning rate of a module's parameters in place of lr, by module id.",
    )
    log_lr_lr: float | None = Field(
        None, gt=0, description="Outer learning rate of the learned log inner rates (null: lr)."
    )
    schedule: Literal["constant", "cosine"] = Field(
        "constant",
        description=(
            "Every outer learning rate times a factor of the applied updates so far "
            "(weights_seq_no, so a resumed run continues it exactly): constant: 1; cosine: "
            "from 1 to min_lr_ratio along half a cosine over decay_steps updates after the "
            "warm-up (learners.meta.lr_schedule)."
        ),
    )
    warmup_steps: int = Field(
        0, ge=0, description="Linear warm-up: update t < warmup_steps uses (t + 1) / warmup_steps."
    )
    decay_steps: int | None = Field(
        None, ge=1, description="Updates of the cosine decay after the warm-up (schedule cosine)."
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="The cosine schedule's last factor (schedule cosine)."
    )

    @model_validator(mode="after")
    def _schedule_steps(self) -> OuterConfig:
        if self.schedule == "cosine" and self.decay_steps is None:
            raise ValueError(
                "outer.schedule 'cosine' decays over outer.decay_steps updates; set it (e.g. "
                "training.iterations minus outer.warmup_steps)"
            )
        return self

    @field_validator("module_lr")
    @classmethod
    def _positive_module_lrs(cls, lrs: dict[str, float]) -> dict[str, float]:
        bad = {m: lr for m, lr in lrs.items() if not lr > 0}
        if bad:
            raise ValueError(f"module_lr values must be > 0, got {bad}")
        return lrs


StandardizedColumn = Literal["rewards", "returns"]
"""The batch columns `MetaConfig.column_stats` may standardise."""

AlgorithmName = Literal[registered_names()]  # type: ignore[valid-type]
"""Every name the registry holds (`learners.algorithms.catalog`)."""


class MetaConfig(BaseModel):
    """A meta-learner: its modules, the inner rule, the outer optimizer and how tasks run."""

    model_config = _STRICT

    algorithm: AlgorithmName = Field(
        "maml",
        description=(
            "maml: second-order MAML; fomaml: first-order MAML (inner.first_order=True); "
            "metasgd: meta-trained inner learning rates (inner.learned_lr, default 'element'); "
            "macaw: value function then advantage-weighted policy in the inner loop, learned "
            "per-tensor inner rates (see the macaw section); context: a permutation-invariant "
            "encoder of the support transitions gives a task latent the policy reads (see the "
            "context section). Each is a module of learners.algorithms."
        ),
    )
    modules: dict[str, ModuleSpec] = Field(
        default_factory=lambda: {DEFAULT_MODULE_ID: ModuleSpec(obs_dim=1, action_dim=1)},
        description="Module id -> spec; each module is its own model with its own loss.",
    )
    modules_to_update: list[str] | None = Field(
        None, description="Modules meta-trained (default: all); the others stay unchanged."
    )
    inner: InnerConfig = Field(default_factory=InnerConfig, description="Inner update rule.")
    outer: OuterConfig = Field(default_factory=OuterConfig, description="Outer optimizer.")
    macaw: MacawConfig | None = Field(
        None, description="MACAW's settings (algorithm macaw; defaults filled in)."
    )
    context: ContextConfig | None = Field(
        None, description="The context learner's settings (algorithm context; defaults filled in)."
    )
    column_stats: dict[StandardizedColumn, InputStats] = Field(
        default_factory=dict,
        description=(
            "Batch columns standardised, (x - mean) / std, wherever a batch enters the "
            "learner (every meta-step, evaluation and adapt, before any loss or encoder "
            "reads them): rewards and returns, one feature each. A run sets them from "
            "data.normalize's statistics of the training data; observations are the "
            "modules' own (input_stats). Empty: the columns as given."
        ),
    )
    vectorize: Literal["vmap", "loop"] = Field(
        "vmap", description="vmap over the task dimension (fast) or a per-task loop (fallback)."
    )
    dtype: Literal["float32", "float64"] = Field("float32", description="Parameter dtype.")
    float32_matmul: Literal["ieee", "tf32"] = Field(
        "ieee",
        description=(
            "float32 matrix products on a CUDA device: 'ieee' (full float32) or 'tf32' "
            "(tensor cores: inputs rounded to a 10-bit mantissa, about 1e-3 relative error, "
            "several times the throughput). Applies during the learner's own calls only; no "
            "effect on the CPU or in float64. Not part of what a saved state must match."
        ),
    )
    seed: int = Field(0, ge=0, description="Seed of the model initialisation.")
    compile: Literal["off", "default", "reduce-overhead"] = Field(
        "off",
        description=(
            "Run the whole meta-step (inner updates, query losses, meta-gradient, clipping, "
            "outer update) as one torch.compile'd function in this mode (reduce-overhead: "
            "CUDA graphs on a GPU); off: eager, the reference. The first step of each "
            "meta-batch shape compiles (seconds to a minute, logged); a configuration that "
            "cannot compile logs why and runs eager. Not part of what a saved state must match."
        ),
    )

    @field_validator("column_stats")
    @classmethod
    def _one_feature(cls, stats: dict[str, InputStats]) -> dict[str, InputStats]:
        for column, found in stats.items():
            if len(found.mean) != 1:
                raise ValueError(
                    f"column_stats.{column} hold {len(found.mean)} features; expected one "
                    f"(a {column} value is one number)"
                )
        return stats

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_off_as_written(cls, value: object) -> object:
        # YAML 1.1 reads a bare `off` (`--set learners.compile=off`) as false.
        return "off" if value is False else value

    @field_validator("modules")
    @classmethod
    def _module_ids(cls, modules: dict[str, ModuleSpec]) -> dict[str, ModuleSpec]:
        if not modules:
            raise ValueError("at least one module is required")
        for module_id in modules:
            if not module_id or "/" in module_id:
                raise ValueError(
                    f"module id {module_id!r} must be non-empty and contain no '/' "
                    "(it names checkpoint entries and metric keys)"
                )
        return modules

    @model_validator(mode="after")
    def _resolve(self) -> MetaConfig:
        _check_data_modules(self.modules)
        if self.modules_to_update is not None:
            unknown = [m for m in self.modules_to_update if m not in self.modules]
            if unknown or not self.modules_to_update:
                raise ValueError(
                    f"modules_to_update {self.modules_to_update} must name at least one of "
                    f"the modules {sorted(self.modules)}; unknown: {unknown}"
                )
        algorithm = algorithm_for(self.algorithm)
        for other in registered_algorithms():
            foreign = other.section not in (None, algorithm.section)
            if foreign and getattr(self, other.section) is not None:
                raise ValueError(
                    f"the {other.section} section applies to algorithm {other.names[0]!r}, "
                    f"not {self.algorithm!r}; drop it or set algorithm: {other.names[0]}"
                )
        view = ConfigView(
            name=self.algorithm,
            section=getattr(self, algorithm.section) if algorithm.section else None,
            modules=self.modules,
            modules_to_update=self.modules_to_update,
            inner=self.inner,
            given={"inner": self.inner.model_fields_set, "outer": self.outer.model_fields_set},
        )
        resolution = algorithm.resolve(view)
        if algorithm.section is not None:
            setattr(self, algorithm.section, resolution.section)
        self.modules = resolution.modules
        inner, outer = resolution.inner, resolution.outer
        # The validator owns the config it builds: the sections are replaced, never changed.
        if inner:
            self.inner = self.inner.model_copy(update=inner)
        if outer:
            self.outer = self.outer.model_copy(update=outer)
        return self

    @property
    def trained_modules(self) -> list[str]:
        """Module ids meta-trained, in the order of `modules`."""
        chosen = self.modules_to_update
        return [m for m in self.modules if chosen is None or m in chosen]

    @property
    def rollout_module(self) -> str:
        """The module evaluation rolls out in an environment (the algorithm's policy)."""
        return algorithm_for(self.algorithm).rollout_module(self)

    @property
    def observing_modules(self) -> list[str]:
        """The modules whose input is one observation of the data (the algorithm's choice:
        an encoder of whole transitions is not one)."""
        return algorithm_for(self.algorithm).observing_modules(self)

    @property
    def composed_inputs(self) -> dict[str, ComposedInput]:
        """The modules whose first input is batch columns concatenated, each with its parts
        and whether they are standardised (the algorithm's choice: an encoder of
        transitions)."""
        return algorithm_for(self.algorithm).composed_inputs(self)

    @property
    def sample_columns(self) -> tuple[str, ...]:
        """The columns every task sample of `rollout_module` must hold for the algorithm."""
        return algorithm_for(self.algorithm).sample_columns(self)

    @property
    def data_modules(self) -> list[str]:
        """Module ids whose rows the trained modules read (a meta-batch holds these), in the
        order of `modules`."""
        read = {self.modules[m].data_module or m for m in self.trained_modules}
        return [m for m in self.modules if m in read]


def _check_data_modules(modules: dict[str, ModuleSpec]) -> None:
    for module_id, spec in modules.items():
        source = spec.data_module
        if source is None:
            continue
        if source == module_id or source not in modules or modules[source].data_module:
            raise ValueError(
                f"module {module_id!r} has data_module {source!r}; expected another module of "
                f"{sorted(modules)} that reads its own rows"
            )
