"""Losses: plain functions `loss(call, batch) -> scalar Tensor` that see the whole batch.

`call(module_id, *inputs)` runs any module's forward with its current parameters (the ones
being differentiated for the module the loss trains, possibly adapted ones for the others),
the first input (the observation) shaped `[B, *obs_shape]` of the module called and the
others flattened per row; `call.module_id` names the module the loss trains. `batch` is
that module's columns (`obs`, `actions`, `rewards`, `new_obs`, `returns`, ...). A loss can so
weight its rows by another module's output (`.detach()` it to stop the gradient) or evaluate a
critic on `new_obs`. A user loss has the same signature and is named in config as
`package.module:function`. Every loss here is a mean over the rows, so it composes with
`torch.func.grad`, `vmap` and second-order meta-gradients (no data-dependent control flow).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from learners.params import Params


class ModuleCall:
    """`call(module_id, *inputs)`: a module's forward with the parameters of the current step.

    Inputs are flattened per row (`[B, ...] -> [B, -1]`), as the models expect, except the
    first one of a module whose entry in `obs_shapes` has several dimensions (an image):
    that one is shaped `[B, *obs_shape]`. Built by the learners; a loss only calls it.
    """

    __slots__ = ("_buffers", "_modules", "_obs_shapes", "_params", "module_id")

    def __init__(
        self,
        module_id: str,
        modules: Mapping[str, nn.Module],
        params: Params,
        buffers: Params,
        obs_shapes: Mapping[str, tuple[int, ...]] | None = None,
    ) -> None:
        self.module_id = module_id
        """The module whose loss is being computed."""
        self._modules = modules
        self._params = params
        self._buffers = buffers
        self._obs_shapes = obs_shapes or {}

    def __call__(self, module_id: str, *inputs: Tensor) -> Any:
        params = self._params.get(module_id)
        if params is None:
            raise KeyError(
                f"loss of module {self.module_id!r} calls module {module_id!r}, which has no "
                f"parameters here; the learner's modules are {sorted(self._params)}"
            )
        flat = tuple(x if x.dim() == 2 else x.reshape(x.shape[0], -1) for x in inputs)
        shape = self._obs_shapes.get(module_id, ())
        if len(shape) > 1 and inputs:
            flat = (inputs[0].reshape(inputs[0].shape[0], *shape), *flat[1:])
        buffers = self._buffers.get(module_id)
        weights = (params, buffers) if buffers else params
        return functional_call(self._modules[module_id], weights, flat)


LossFn = Callable[[ModuleCall, Mapping[str, Tensor]], Tensor]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def column(call: ModuleCall, batch: Mapping[str, Tensor], name: str) -> Tensor:
    """`batch[name]`, or a `ValueError` naming the module and the columns it has."""
    if name not in batch:
        raise ValueError(
            f"module {call.module_id!r}: the batch has columns {sorted(batch)}, expected {name!r}"
        )
    return batch[name]


def _own_outputs(call: ModuleCall, batch: Mapping[str, Tensor]) -> Any:
    return call(call.module_id, column(call, batch, "obs"))


def _mean_of(outputs: Tensor | Mapping[str, Tensor], loss: str) -> Tensor:
    if isinstance(outputs, Tensor):
        return outputs
    if isinstance(outputs, Mapping) and "mean" in outputs:
        return outputs["mean"]
    raise TypeError(
        f"{loss} expects the model to return a tensor or a dict with 'mean', "
        f"got {type(outputs).__name__}"
    )


def matching(prediction: Tensor, target: Tensor, loss: str, what: str = "actions") -> Tensor:
    """`prediction` shaped like `target` ([B] targets meet [B, 1] predictions)."""
    if prediction.shape == target.shape:
        return prediction
    if prediction.numel() != target.numel():
        raise ValueError(
            f"{loss}: model output shape {tuple(prediction.shape)} does not match {what} "
            f"shape {tuple(target.shape)}; check the module's action_dim"
        )
    return prediction.reshape(target.shape)


def mse_loss(call: ModuleCall, batch: Mapping[str, Tensor]) -> Tensor:
    """Mean squared error of the module's output on `obs` to `actions`: regression, or MSE
    behaviour cloning. With a gaussian head the mean is used."""
    target = column(call, batch, "actions")
    prediction = matching(_mean_of(_own_outputs(call, batch), "mse"), target, "mse")
    return (prediction - target).square().mean()


def gaussian_nll_loss(call: ModuleCall, batch: Mapping[str, Tensor]) -> Tensor:
    """Negative log-likelihood of `actions` under a diagonal gaussian, per row, mean over rows."""
    target = column(call, batch, "actions")
    outputs = _own_outputs(call, batch)
    if not isinstance(outputs, Mapping) or "log_std" not in outputs:
        raise TypeError(
            "gaussian_nll expects the model to return {'mean', 'log_std'} (head 'gaussian'), "
            f"got {type(outputs).__name__}"
        )
    mean = matching(outputs["mean"], target, "gaussian_nll")
    return gaussian_nll_per_row(mean, outputs["log_std"].reshape(target.shape), target).mean()


def gaussian_nll_per_row(mean: Tensor, log_std: Tensor, target: Tensor) -> Tensor:
    """`[B]`: each row's negative log-likelihood of `target` `[B, ...]` under a diagonal
    gaussian, summed over the action dimensions."""
    z = (target - mean) * torch.exp(-log_std)
    per_dim = 0.5 * z.square() + log_std + _HALF_LOG_2PI
    return per_dim.reshape(per_dim.shape[0], -1).sum(-1)


def cross_entropy_loss(call: ModuleCall, batch: Mapping[str, Tensor]) -> Tensor:
    """Cross-entropy of int64 `actions` (class indices) under the logits."""
    actions = column(call, batch, "actions")
    if actions.dtype != torch.int64:
        raise TypeError(
            f"cross_entropy expects int64 actions (class indices), got {actions.dtype}; "
            "discrete datasets store actions as int64"
        )
    outputs = _own_outputs(call, batch)
    if not isinstance(outputs, Tensor):
        raise TypeError(f"cross_entropy expects logits as a tensor, got {type(outputs).__name__}")
    return F.cross_entropy(outputs.reshape(actions.shape[0], -1), actions.reshape(-1))


LOSSES: dict[str, LossFn] = {
    "mse": mse_loss,
    "gaussian_nll": gaussian_nll_loss,
    "cross_entropy": cross_entropy_loss,
}
"""The built-in losses by config name."""


def resolve_loss(name: str) -> LossFn:
    """A built-in loss by name, or a user function written `package.module:function`."""
    if name in LOSSES:
        return LOSSES[name]
    module_name, sep, attribute = name.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(
            f"unknown loss {name!r}: expected one of {sorted(LOSSES)} "
            "or a user function written 'package.module:function'"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"loss {name!r}: cannot import module {module_name!r} ({error})") from None
    fn = getattr(module, attribute, None)
    if not callable(fn):
        raise ValueError(f"loss {name!r}: module {module_name!r} has no function {attribute!r}")
    return fn
