"""Losses: plain functions `(outputs, batch_for_module) -> scalar Tensor`.

`outputs` is what the module's forward returned (a tensor, or the gaussian head's dict);
`batch_for_module` is that module's columns (`obs`, `actions`, ...). A user loss has the same
signature and is named in config as `package.module:function`. Every loss here is a mean over
the rows, so it composes with `torch.func.grad` and `vmap` (no data-dependent control flow).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

LossFn = Callable[[Any, Mapping[str, Tensor]], Tensor]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _mean_of(outputs: Tensor | Mapping[str, Tensor], loss: str) -> Tensor:
    if isinstance(outputs, Tensor):
        return outputs
    if isinstance(outputs, Mapping) and "mean" in outputs:
        return outputs["mean"]
    raise TypeError(
        f"{loss} expects the model to return a tensor or a dict with 'mean', "
        f"got {type(outputs).__name__}"
    )


def _matching(prediction: Tensor, target: Tensor, loss: str) -> Tensor:
    """`prediction` shaped like `target` ([B] targets meet [B, 1] predictions)."""
    if prediction.shape == target.shape:
        return prediction
    if prediction.numel() != target.numel():
        raise ValueError(
            f"{loss}: model output shape {tuple(prediction.shape)} does not match actions "
            f"shape {tuple(target.shape)}; check the module's action_dim"
        )
    return prediction.reshape(target.shape)


def mse_loss(outputs: Tensor | Mapping[str, Tensor], batch: Mapping[str, Tensor]) -> Tensor:
    """Mean squared error to `actions`: regression, or MSE behaviour cloning.

    With a gaussian head the mean is used, so MSE cloning works with either continuous head.
    """
    target = batch["actions"]
    prediction = _matching(_mean_of(outputs, "mse"), target, "mse")
    return (prediction - target).square().mean()


def gaussian_nll_loss(outputs: Mapping[str, Tensor], batch: Mapping[str, Tensor]) -> Tensor:
    """Negative log-likelihood of `actions` under a diagonal gaussian, per row, mean over rows."""
    if not isinstance(outputs, Mapping) or "log_std" not in outputs:
        raise TypeError(
            "gaussian_nll expects the model to return {'mean', 'log_std'} (head 'gaussian'), "
            f"got {type(outputs).__name__}"
        )
    target = batch["actions"]
    mean = _matching(outputs["mean"], target, "gaussian_nll")
    log_std = outputs["log_std"].reshape(target.shape)
    z = (target - mean) * torch.exp(-log_std)
    per_dim = 0.5 * z.square() + log_std + _HALF_LOG_2PI
    return per_dim.reshape(per_dim.shape[0], -1).sum(-1).mean()


def cross_entropy_loss(outputs: Tensor, batch: Mapping[str, Tensor]) -> Tensor:
    """Cross-entropy of int64 `actions` (class indices) under the logits."""
    actions = batch["actions"]
    if actions.dtype != torch.int64:
        raise TypeError(
            f"cross_entropy expects int64 actions (class indices), got {actions.dtype}; "
            "discrete datasets store actions as int64"
        )
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
