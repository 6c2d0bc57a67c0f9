"""One module's configuration: its sizes, network and loss (`ModuleSpec`, `ModelConfig`).

Part of the learners' typed configuration (`learners.config`), every field documented.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

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
    """The module's network: a user factory, or the built-in MLP (over flattened observations
    or after a conv encoder) with one of four heads."""

    model_config = _STRICT

    factory: str | None = Field(
        None,
        description=(
            "A user network written 'package.module:callable', called as "
            "callable(obs_shape, action_dim, **kwargs) and returning an nn.Module without "
            "buffers whose forward gives what `head` names (learners.models.factory). "
            "Unset: the built-in network `encoder` chooses."
        ),
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments of the factory: JSON values, saved with the config.",
    )
    encoder: Literal["flat", "conv"] = Field(
        "flat",
        description=(
            "Built-in networks: flat: the MLP over the observation flattened per row; conv: "
            "a small conv stack over [C, H, W] observations with the MLP after it "
            "(learners.models.conv)."
        ),
    )
    conv_channels: tuple[int, ...] = Field(
        (16, 32, 32),
        description=(
            "Output channels of each conv layer (encoder conv): the first two 4x4 stride 2, "
            "the others 3x3 stride 1, all padded by 1."
        ),
    )

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
            "advantage head on (last hidden features, action) (an advantage-weighted "
            "policy). A factory's network returns what its head names (the loss reads it)."
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

    @field_validator("conv_channels")
    @classmethod
    def _conv_layers(cls, channels: tuple[int, ...]) -> tuple[int, ...]:
        if not channels or any(size < 1 for size in channels):
            raise ValueError(
                f"conv_channels must name at least one layer, each >= 1, got {list(channels)}"
            )
        return channels

    @field_validator("factory")
    @classmethod
    def _factory_path(cls, path: str | None) -> str | None:
        if path is not None:
            module_name, sep, attribute = path.partition(":")
            if not sep or not module_name or not attribute:
                raise ValueError(f"factory {path!r} must be written 'package.module:callable'")
        return path

    @field_validator("kwargs")
    @classmethod
    def _json_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        # Saved in every manifest and learner state: the factory sees the same values when
        # load_learner rebuilds it (a tuple comes back a list, so it is one already).
        try:
            return json.loads(json.dumps(kwargs, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ValueError(f"kwargs must be JSON values (they are saved): {error}") from None

    @model_validator(mode="after")
    def _network_choice(self) -> ModelConfig:
        if self.factory is None and self.kwargs:
            raise ValueError(
                f"kwargs {sorted(self.kwargs)} are the factory's; set factory or drop kwargs"
            )
        if self.factory is not None and self.encoder != "flat":
            raise ValueError(
                f"encoder {self.encoder!r} chooses a built-in network, which factory "
                f"{self.factory!r} replaces; drop one of them"
            )
        if self.factory is None and self.head == "mean_advantage" and not self.hidden_sizes:
            raise ValueError(
                "head 'mean_advantage' reads the last hidden layer's features: give "
                "hidden_sizes at least one layer"
            )
        return self


class InputStats(BaseModel):
    """Per-feature statistics a module's observations (or a batch column, `MetaConfig.
    column_stats`) are standardised with: `(x - mean) / std`."""

    model_config = _STRICT

    mean: tuple[float, ...] = Field(description="Mean of each observation feature (flattened).")
    std: tuple[float, ...] = Field(
        description="Standard deviation of each feature (flattened), > 0 (a constant "
        "feature's is 1)."
    )
    ignored: tuple[int, ...] = Field(
        (),
        description="Features (flattened indices) the module reads as 0 after standardising, "
        "whatever they hold (data.ignore_obs_features).",
    )

    @model_validator(mode="after")
    def _one_per_feature(self) -> InputStats:
        if len(self.mean) != len(self.std):
            raise ValueError(f"{len(self.mean)} means but {len(self.std)} standard deviations")
        if any(not std > 0 for std in self.std):
            raise ValueError(f"every std must be > 0, got {list(self.std)}")
        outside = [i for i in self.ignored if not 0 <= i < len(self.mean)]
        if outside or len(set(self.ignored)) != len(self.ignored):
            raise ValueError(
                f"ignored features must be distinct indices in [0, {len(self.mean)}), got "
                f"{list(self.ignored)}"
            )
        return self


class ModuleSpec(BaseModel):
    """One trainable module (policy, agent or regressor): its sizes, model and loss."""

    model_config = _STRICT

    obs_dim: int = Field(ge=1, description="Observation size after flattening each row.")
    obs_shape: tuple[int, ...] | None = Field(
        None,
        description=(
            "Shape of one observation (e.g. [3, 32, 32]); batches give the module obs of shape "
            "[..., *obs_shape]. Its product is obs_dim. Default: [obs_dim]."
        ),
    )
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
            "An algorithm may set its modules' losses itself (learners.algorithms)."
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
    input_stats: InputStats | None = Field(
        None,
        description=(
            "Observations reach the network as (obs - mean) / std, every call (training, "
            "evaluation, rollouts, load_learner, the MLflow pyfunc): a run sets them from "
            "data.normalize's statistics of the training data (learners.models.factory). "
            "None: observations as given."
        ),
    )

    latent_dim: int = Field(
        0,
        ge=0,
        description=(
            "Size of the task latent the network is conditioned on (0: none). The module's "
            "parameters gain an entry 'latent', the latent of an empty context, appended to "
            "every observation; adaptation replaces it (learners.models.conditioned). Set by "
            "the algorithms that infer a task from its context."
        ),
    )

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """`obs_shape`, or `(obs_dim,)` when it is not given."""
        return self.obs_shape if self.obs_shape is not None else (self.obs_dim,)

    @model_validator(mode="after")
    def _obs_shape_holds_obs_dim(self) -> ModuleSpec:
        shape = self.obs_shape
        if shape is not None and (not shape or any(size < 1 for size in shape)):
            raise ValueError(f"obs_shape must be sizes >= 1, got {list(shape)}")
        if shape is not None and math.prod(shape) != self.obs_dim:
            raise ValueError(
                f"obs_shape {list(shape)} holds {math.prod(shape)} values but obs_dim is "
                f"{self.obs_dim}; expected obs_dim: {math.prod(shape)}"
            )
        stats = self.input_stats
        if stats is not None and len(stats.mean) != self.obs_dim:
            raise ValueError(
                f"input_stats hold {len(stats.mean)} features but obs_dim is {self.obs_dim}; "
                "expected one mean and one std per observation feature"
            )
        if self.model.encoder == "conv" and len(self.observation_shape) != 3:
            raise ValueError(
                f"model.encoder 'conv' reads [C, H, W] observations, but obs_shape is "
                f"{list(self.observation_shape)}; set obs_shape to the image's [C, H, W]"
            )
        if self.latent_dim and len(self.observation_shape) != 1:
            raise ValueError(
                f"latent_dim {self.latent_dim} conditions flat observations, but obs_shape is "
                f"{list(self.observation_shape)}; drop obs_shape"
            )
        return self

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
