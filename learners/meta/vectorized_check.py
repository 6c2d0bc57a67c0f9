"""Vmapped meta-gradients checked against the per-task loop: refused when they disagree.

`MetaLearner` vmaps its tasks by default, and vmap is only as right as torch's batching rule
for every operation the network runs: a wrong rule gives wrong second-order meta-gradients
without any error. Two checks guard it:

- `refuse_wrong_batching(config, models)`, from the config alone: a second-order algorithm
  under `vectorize: vmap` with a layer of `torch_compat.WRONG_VMAP_BATCHING` (LayerNorm) is
  refused, naming the module path and the three ways out. `offmeta run` calls it before Ray
  starts, the train stage before it trains.
- `check_vectorized_gradients(learner, meta_batch)`, for what no list knows: the vmapped
  meta-gradients of the first `TASKS` tasks against the per-task loop's, once, on the first
  meta-batch of a run (`learners.check_vectorized: first`). A parameter tensor whose two
  gradients differ by more than `tolerance(dtype)` times its gradient's norm is named.

A first-order algorithm needs neither: it differentiates no inner gradient, so the backward
of a backward, where the wrong rules lie, never runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

from learners.config import MetaConfig
from learners.meta.learner import MetaGradients, MetaLearner
from learners.meta.meta_batch import MetaBatch
from learners.torch_compat import WRONG_VMAP_BATCHING

__all__ = [
    "TASKS",
    "VectorizedGradientError",
    "check_vectorized_gradients",
    "refuse_wrong_batching",
    "tolerance",
]

TASKS = 2
"""Tasks of the first meta-batch the self-check compares (fewer if it has fewer)."""
_ULPS = 2**10
"""The tolerance in units of the dtype's epsilon: vmap and the loop sum in other orders,
through a few layers and a second backward (float32: 1.2e-4, float64: 2.3e-13)."""
_WAYS_OUT = (
    "set learners.vectorize: loop, use a first-order algorithm (learners.algorithm: fomaml), "
    "or write the layer norm from mean and var"
)
_SHOWN = 5
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class VectorizedGradientError(ValueError):
    """The vmapped meta-gradients are known, or measured, to differ from the per-task loop's."""


def refuse_wrong_batching(config: MetaConfig, models: Mapping[str, nn.Module]) -> None:
    """Raise `VectorizedGradientError` if a second-order algorithm vmaps over tasks a network
    holding a layer whose batching rule is known to be wrong; the message names the first
    such module path (`<module id>.<submodule>`) and how to avoid it."""
    if config.vectorize != "vmap" or config.inner.first_order:
        return
    for module_id, model in models.items():
        for path, layer in model.named_modules():
            reason = next(
                (why for kind, why in WRONG_VMAP_BATCHING.items() if isinstance(layer, kind)),
                None,
            )
            if reason is not None:
                raise VectorizedGradientError(
                    f"learners.modules.{module_id}: {module_id}.{path} is an "
                    f"nn.{type(layer).__name__}, and {reason}, so algorithm "
                    f"{config.algorithm!r} (second order) under learners.vectorize: vmap would "
                    f"train on wrong meta-gradients; {_WAYS_OUT} (docs/networks.md#vmap)"
                )


def tolerance(dtype: torch.dtype) -> float:
    """The relative difference allowed between vmapped and looped meta-gradients."""
    return _ULPS * torch.finfo(dtype).eps


def check_vectorized_gradients(learner: MetaLearner, meta_batch: MetaBatch) -> None:
    """Raise `VectorizedGradientError` naming every parameter whose vmapped meta-gradient on
    the first `TASKS` tasks of `meta_batch` differs from the per-task loop's by more than
    `tolerance` times the loop gradient's norm. Does nothing unless the learner vmaps.

    The learner's parameters, optimizer and `weights_seq_no` are untouched and its RNG is
    left as it was, so a checked run trains exactly as an unchecked one. This worker's own
    gradients are compared (`MetaLearner.compute_meta_gradients`, never a data-parallel
    average). A network that draws random numbers (dropout) cannot agree with itself here.
    Under `float32_matmul: tf32` on a GPU, float32 products round to 10 bits, far above this
    tolerance: nothing is checked there either.
    """
    config = learner.config
    tf32 = config.float32_matmul == "tf32" and config.dtype == "float32"
    if config.vectorize != "vmap" or (tf32 and learner.device.type == "cuda"):
        return
    head = {
        part: {m: {c: t[:TASKS] for c, t in columns.items()} for m, columns in batch.items()}
        for part, batch in meta_batch.items()
    }
    devices = [learner.device] if learner.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        vmapped, _ = MetaLearner.compute_meta_gradients(
            learner, head, support_loss_after=False, vectorize="vmap"
        )
        looped, metrics = MetaLearner.compute_meta_gradients(
            learner, head, support_loss_after=False, vectorize="loop"
        )
    differing = _differing(vmapped, looped)
    if not differing:
        return
    dtype = _DTYPES[config.dtype]
    shown = ", ".join(f"{name} ({rel:.1e})" for name, rel in differing[:_SHOWN])
    more = f" and {len(differing) - _SHOWN} more" if len(differing) > _SHOWN else ""
    raise VectorizedGradientError(
        f"learners.check_vectorized: the vmapped meta-gradients of {metrics['num_tasks']} "
        f"tasks differ from the per-task loop's in {shown}{more} (relative difference; "
        f"{str(dtype).removeprefix('torch.')} tolerance {tolerance(dtype):.1e}): a layer "
        f"whose vmap batching rule is wrong; {_WAYS_OUT}, or replace that layer "
        "(docs/networks.md#vmap); a network that draws random numbers cannot be checked: set "
        "learners.check_vectorized: off"
    )


def _differing(vmapped: MetaGradients, looped: MetaGradients) -> list[tuple[str, float]]:
    """`(name, relative difference)` of each gradient beyond the tolerance, in order."""
    pairs: dict[str, tuple[Tensor, Tensor]] = {
        f"{m}.{name}": (grad, looped.params[m][name])
        for m, named in vmapped.params.items()
        for name, grad in named.items()
    }
    pairs.update({f"log_lr {key}": (g, looped.log_lrs[key]) for key, g in vmapped.log_lrs.items()})
    names = list(pairs)
    with torch.no_grad():
        errors = torch.stack([(v - lo).norm() for v, lo in pairs.values()]).tolist()
        scales = torch.stack([lo.norm() for _, lo in pairs.values()]).tolist()
    found = []
    for name, (vmap_grad, _), error, scale in zip(
        names, pairs.values(), errors, scales, strict=True
    ):
        # A non-finite loop gradient is the non-finite policies' business, not this check's;
        # a non-finite difference beside a finite one is a disagreement.
        if math.isfinite(scale) and not error <= tolerance(vmap_grad.dtype) * scale:
            found.append((name, error / scale if scale else math.inf))
    return found
