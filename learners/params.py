"""Parameter dicts: `{module_id: {name: Tensor}}`, taken from `nn.Module`s without touching them.

A learner works on these dicts, never on a module's own parameters: every update returns new
tensors, so the modules (and any params the caller still holds) stay as they were. Buffers
(running statistics and the like) are taken separately and passed explicitly to the forward.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn

from learners.models.spec import DEFAULT_MODULE_ID

Params = dict[str, dict[str, Tensor]]
"""Module id -> parameter (or buffer) name -> tensor."""

Batch = Mapping[str, Mapping[str, Tensor]]
"""Module id -> column name -> tensor, e.g. `{"default_policy": {"obs": ..., "actions": ...}}`."""


def _as_module_map(modules: nn.Module | Mapping[str, nn.Module]) -> Mapping[str, nn.Module]:
    if isinstance(modules, nn.Module):
        return {DEFAULT_MODULE_ID: modules}
    for module_id, module in modules.items():
        if not isinstance(module, nn.Module):
            raise TypeError(
                f"module {module_id!r} is a {type(module).__name__}, expected a torch.nn.Module"
            )
    return modules


def params_from_modules(
    modules: nn.Module | Mapping[str, nn.Module], *, clone: bool = False
) -> Params:
    """The parameters of one module (id `default_policy`) or of each module in a mapping.

    Without `clone` the dict holds the modules' own `nn.Parameter`s (an update never writes
    to them, and gradients can still flow into them); with `clone` it holds detached copies
    that require grad exactly when the originals do, for use as independent meta-parameters.
    """
    result: Params = {}
    for module_id, module in _as_module_map(modules).items():
        named = dict(module.named_parameters())
        if clone:
            named = {
                name: p.detach().clone().requires_grad_(p.requires_grad)
                for name, p in named.items()
            }
        result[module_id] = named
    return result


def buffers_from_modules(modules: nn.Module | Mapping[str, nn.Module]) -> Params:
    """The buffers of each module (detached copies), to pass explicitly to the forward."""
    return {
        module_id: {name: b.detach().clone() for name, b in module.named_buffers()}
        for module_id, module in _as_module_map(modules).items()
    }


def map_params(fn: Callable[[Tensor], Tensor], params: Params) -> Params:
    """A new dict with `fn` applied to every tensor."""
    return {mid: {name: fn(t) for name, t in named.items()} for mid, named in params.items()}


def detach_params(params: Params) -> Params:
    """Detached views (no graph to whatever produced them); no data is copied."""
    return map_params(Tensor.detach, params)


def to_device(params: Params, device: torch.device | str, dtype: torch.dtype | None) -> Params:
    """Copies on `device`; floating-point tensors also cast to `dtype` when given."""

    def move(t: Tensor) -> Tensor:
        cast = dtype if dtype is not None and t.is_floating_point() else t.dtype
        return t.detach().to(device=device, dtype=cast, copy=True)

    return map_params(move, params)
