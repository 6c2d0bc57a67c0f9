"""One module's configuration: its sizes, network and loss (`ModuleSpec`, `ModelConfig`).

Part of the learners' typed configuration (`learners.config`), every field documented.
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
