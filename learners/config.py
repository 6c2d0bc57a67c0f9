"""Typed configuration of the learners: one pydantic model per concern, every field documented.

`MetaConfig` is the whole learner (it is saved inside every learner state and nests in the
flow's run config); `InnerConfig` alone configures a `DifferentiableLearner`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_MODULE_ID = "default_policy"

_STRICT = ConfigDict(extra="forbid")

# Which head each built-in loss can train; user losses ("package.module:function") accept any.
_LOSS_HEADS = {
    "mse": ("deterministic", "gaussian", "mean_advantage"),
    "gaussian_nll": ("gaussian",),
    "cross_entropy": ("categorical",),
}


class ModelConfig(BaseModel):
    """A multi-layer perceptron from flattened observations to the head's outputs."""

    model_config = _STRICT

    hidden_sizes: tuple[int, ...] = Field(
        (40, 40), description="Width of each hidden layer, input side first; () is linear."
    )
    activation: Literal["relu", "tanh", "gelu", "elu", "silu"] = Field(
        "relu", description="Non-linearity after every hidden layer."
    )
    head: Literal["deterministic", "gaussian", "categorical", "mean_advantage"] = Field(
        "deterministic",
        description=(
            "deterministic: one output per action dimension (regression, MSE cloning); "
            "gaussian: mean per action dimension plus a learned state-independent log-std; "
            "categorical: one logit per discrete action; mean_advantage: action mean plus an "
            "advantage head on (last hidden features, action) (MACAW's policy)."
        ),
    )
    log_std_init: float = Field(0.0, description="Initial log standard deviation (gaussian head).")
    advantage_hidden_sizes: tuple[int, ...] = Field(
        (32,), description="Hidden layers of the advantage head (head mean_advantage)."
    )

    @field_validator("hidden_sizes", "advantage_hidden_sizes")
    @classmethod
    def _positive_widths(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if any(size < 1 for size in sizes):
            raise ValueError(f"every hidden size must be >= 1, got {list(sizes)}")
        return sizes

    @model_validator(mode="after")
    def _trunk_for_the_advantage_head(self) -> ModelConfig:
        if self.head == "mean_advantage" and not self.hidden_sizes:
            raise ValueError(
                "head 'mean_advantage' reads the last hidden layer's features: give "
                "hidden_sizes at least one layer"
            )
        return self


class ModuleSpec(BaseModel):
    """One trainable module (policy, agent or regressor): its sizes, model and loss."""

    model_config = _STRICT

    obs_dim: int = Field(ge=1, description="Observation size after flattening each row.")
    action_dim: int = Field(
        ge=1,
        description="Continuous heads: action (target) size; categorical head: number of actions.",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="The module's network.")
    loss: str = Field(
        "mse",
        description=(
            "Built-in loss (mse, gaussian_nll, cross_entropy) or a user function given as "
            "'package.module:function' taking (call, batch_for_module) -> scalar tensor, "
            "where call(module_id, *inputs) runs any module (see learners.losses). "
            "Algorithm 'macaw' sets the losses of its two modules itself."
        ),
    )
    data_module: str | None = Field(
        None,
        description=(
            "Train on the rows of this module instead of the module's own (a critic reading "
            "its policy's transitions); the batch its loss sees is that module's. "
            "Default: its own rows."
        ),
    )

    @model_validator(mode="after")
    def _loss_fits_head(self) -> ModuleSpec:
        heads = _LOSS_HEADS.get(self.loss)
        if heads is None and ":" not in self.loss:
            raise ValueError(
                f"unknown loss {self.loss!r}: expected one of {sorted(_LOSS_HEADS)} "
                "or a user function written 'package.module:function'"
            )
        if heads is not None and self.model.head not in heads:
            raise ValueError(
                f"loss {self.loss!r} cannot train a {self.model.head!r} head; "
                f"use head {' or '.join(repr(h) for h in heads)}"
            )
        return self


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

    @field_validator("module_lr")
    @classmethod
    def _positive_module_lrs(cls, lrs: dict[str, float]) -> dict[str, float]:
        bad = {m: lr for m, lr in lrs.items() if not lr > 0}
        if bad:
            raise ValueError(f"module_lr values must be > 0, got {bad}")
        return lrs


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


# The inner flags each algorithm implies: (first_order, allowed learned_lr values, default).
_ALGORITHMS = {
    "maml": (False, ("none",), "none"),
    "fomaml": (True, ("none",), "none"),
    "metasgd": (None, ("scalar", "tensor", "element"), "element"),
    "macaw": (False, ("none", "scalar", "tensor", "element"), "tensor"),
}
# Values MACAW takes from the authors' released config unless the config states its own:
# (section, field) -> value; the value function's outer rate goes to outer.module_lr.
_MACAW_DEFAULTS = {("inner", "lr"): 1e-3, ("outer", "lr"): 1e-4, ("outer", "log_lr_lr"): 1e-3}
_MACAW_VALUE_LR = 1e-5


class MetaConfig(BaseModel):
    """A meta-learner: its modules, the inner rule, the outer optimizer and how tasks run."""

    model_config = _STRICT

    algorithm: Literal["maml", "fomaml", "metasgd", "macaw"] = Field(
        "maml",
        description=(
            "maml: second-order MAML; fomaml: first-order MAML (inner.first_order=True); "
            "metasgd: meta-trained inner learning rates (inner.learned_lr, default 'element'); "
            "macaw: value function then advantage-weighted policy in the inner loop, learned "
            "per-tensor inner rates (see the macaw section)."
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
    vectorize: Literal["vmap", "loop"] = Field(
        "vmap", description="vmap over the task dimension (fast) or a per-task loop (fallback)."
    )
    dtype: Literal["float32", "float64"] = Field("float32", description="Parameter dtype.")
    seed: int = Field(0, ge=0, description="Seed of the model initialisation.")

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
        first_order, allowed_lrs, default_lr = _ALGORITHMS[self.algorithm]
        given = self.inner.model_fields_set
        update: dict[str, object] = {}
        if first_order is not None:
            if "first_order" in given and self.inner.first_order != first_order:
                raise ValueError(
                    f"algorithm {self.algorithm!r} sets inner.first_order={first_order}; "
                    f"choose {'fomaml' if first_order is False else 'maml'} instead, "
                    "or drop inner.first_order"
                )
            update["first_order"] = first_order
        if "learned_lr" not in given:
            update["learned_lr"] = default_lr
        elif self.inner.learned_lr not in allowed_lrs:
            hint = "use algorithm 'metasgd'" if self.algorithm != "metasgd" else "pick one"
            raise ValueError(
                f"algorithm {self.algorithm!r} needs inner.learned_lr in {list(allowed_lrs)}, "
                f"got {self.inner.learned_lr!r}; {hint}"
            )
        if update:
            self.inner = self.inner.model_copy(update=update)
        if self.algorithm == "macaw":
            self._resolve_macaw()
        elif self.macaw is not None:
            raise ValueError(
                f"the macaw section applies to algorithm 'macaw', not {self.algorithm!r}; "
                "drop it or set algorithm: macaw"
            )
        return self

    def _resolve_macaw(self) -> None:
        macaw = self.macaw if self.macaw is not None else MacawConfig()
        roles = {"policy": macaw.policy, "value": macaw.value}
        missing = [f"{m!r} ({role})" for role, m in roles.items() if m not in self.modules]
        if missing or macaw.policy == macaw.value:
            raise ValueError(
                f"algorithm 'macaw' needs two modules, a policy and a value function "
                f"(macaw.policy {macaw.policy!r}, macaw.value {macaw.value!r}); modules has "
                f"{sorted(self.modules)}, missing: {', '.join(missing) or 'none'}"
            )
        policy, value = self.modules[macaw.policy], self.modules[macaw.value]
        if self.modules_to_update is not None and set(self.modules_to_update) != set(
            roles.values()
        ):
            raise ValueError(
                f"algorithm 'macaw' trains its policy and value function together; "
                f"modules_to_update is {self.modules_to_update}: drop it"
            )
        default_loss = ModuleSpec.model_fields["loss"].default
        with_loss = {m: self.modules[m].loss for m in roles.values()}
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
        modules = dict(self.modules)
        modules[macaw.value] = value.model_copy(update={"data_module": macaw.policy})
        self.modules = modules
        self.macaw = macaw
        for (section, name), default in _MACAW_DEFAULTS.items():
            part = getattr(self, section)
            if name not in part.model_fields_set:
                setattr(self, section, part.model_copy(update={name: default}))
        if "module_lr" not in self.outer.model_fields_set:
            module_lr = {macaw.value: _MACAW_VALUE_LR}
            self.outer = self.outer.model_copy(update={"module_lr": module_lr})

    @property
    def trained_modules(self) -> list[str]:
        """Module ids meta-trained, in the order of `modules`."""
        chosen = self.modules_to_update
        return [m for m in self.modules if chosen is None or m in chosen]

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
