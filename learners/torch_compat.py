"""Every private torch name `learners` uses, behind one door (STYLE.md 18).

Checked against torch 2.13 (CPU) and torch 2.11 (CUDA, the GPU machines): an upgrade
re-checks this file, and `check_torch_version` refuses any other minor version at import
of `learners`. Each name says which private API it stands for and why no public one serves.
No other module of `learners` writes `torch._` (tests/learners/test_torch_compat.py scans).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    # torch._dynamo.types.GuardFilterEntry: what `torch.compile(options={"guard_filter_fn":
    # ...})` hands its filter; torch exports no public name for the type.
    from torch._dynamo.types import GuardFilterEntry

__all__ = [
    "SUPPORTED_TORCH",
    "WRONG_VMAP_BATCHING",
    "GuardFilterEntry",
    "check_torch_version",
    "dynamo_error",
    "foreach_add",
    "foreach_add_",
    "foreach_addcdiv_",
    "foreach_addcmul_",
    "foreach_copy_",
    "foreach_div",
    "foreach_div_",
    "foreach_lerp",
    "foreach_lerp_",
    "foreach_mul",
    "foreach_mul_",
    "foreach_norm",
    "foreach_sqrt",
    "foreach_sub",
    "graphs_compiled",
    "in_vmap",
    "inductor_mode_options",
]

SUPPORTED_TORCH = "torch>=2.11,<2.14"
"""The torch versions this file was checked against (2.11 and 2.13), as a requirement."""
_OLDEST, _NEWEST = (2, 11), (2, 13)
_VERSION = re.compile(r"(\d+)\.(\d+)")


def check_torch_version(version: str) -> None:
    """Raise ImportError, in one line, unless `version` (a `torch.__version__` string such as
    '2.13.0+cpu') lies in `SUPPORTED_TORCH`."""
    match = _VERSION.match(version)
    found = (int(match.group(1)), int(match.group(2))) if match else None
    if found is None or not _OLDEST <= found <= _NEWEST:
        raise ImportError(
            f"learners needs {SUPPORTED_TORCH} (its private torch calls in "
            f"learners/torch_compat.py were checked against 2.11 and 2.13), found torch "
            f"{version!r}: install a torch in that range"
        )


check_torch_version(torch.__version__)

WRONG_VMAP_BATCHING: dict[type[nn.Module], str] = {
    nn.LayerNorm: (
        "torch's vmap batching rule for the input gradient of layer_norm's backward is wrong "
        "(pytorch/functorch#534)"
    ),
}
"""Layers whose second-order gradients under `torch.func.vmap` are known to be wrong, and why.

Not a private name, but a fact about these torch versions that an upgrade must re-check.
Measured in float64 with torch 2.13 (CPU), vmapped against per-task meta-gradients, MAML
on 20 point-robot-shaped tasks: the parameters before a LayerNorm are off by 0.14% at width
40 and 11% at width 4 (float64 rounding: 1e-16). Listed for the whole supported range
(2.11 to 2.13): the defect is open upstream; 2.11 was not re-measured here.
`learners.meta.vectorized_check` refuses them by module path.
"""

# torch._foreach_*: one fused call over a list of tensors, as torch.optim's foreach path
# runs; torch has no public list-of-tensors arithmetic. Same signatures in 2.11 and 2.13
# (a Tensor scalar is accepted by mul, div and add; addcdiv_ takes a list of Python scalars,
# one per tensor, as torch.optim.Adam's multi-tensor step passes them). None of them has a
# vmap rule: the inner (vmapped) update uses per-tensor ops instead.
foreach_add = torch._foreach_add
foreach_add_ = torch._foreach_add_
foreach_addcdiv_ = torch._foreach_addcdiv_
foreach_addcmul_ = torch._foreach_addcmul_
foreach_copy_ = torch._foreach_copy_
foreach_div = torch._foreach_div
foreach_div_ = torch._foreach_div_
foreach_lerp = torch._foreach_lerp
foreach_lerp_ = torch._foreach_lerp_
foreach_mul = torch._foreach_mul
foreach_mul_ = torch._foreach_mul_
foreach_norm = torch._foreach_norm
foreach_sqrt = torch._foreach_sqrt
foreach_sub = torch._foreach_sub


def in_vmap() -> bool:
    """Whether the caller runs inside `torch.func.vmap`.

    torch._C._functorch.get_interpreter_stack / TransformType: torch.func has no public query
    for the transforms around a call; the functorch interpreter stack knows them.
    """
    stack = torch._C._functorch.get_interpreter_stack() or ()
    return any(level.key() == torch._C._functorch.TransformType.Vmap for level in stack)


def dynamo_error() -> type[Exception]:
    """torch._dynamo.exc.TorchDynamoException: the base of every error dynamo raises while
    compiling; torch exposes no public base class for compilation failures. Looked up when
    needed, since importing dynamo at import of `learners` costs a second."""
    return torch._dynamo.exc.TorchDynamoException


def inductor_mode_options(mode: str) -> dict:
    """torch._inductor.list_mode_options: the inductor options a `torch.compile` mode stands
    for, so that one option can be changed on top of them (`torch.compile` takes a mode or
    options, not both); no public API lists them."""
    from torch._inductor import list_mode_options

    return dict(list_mode_options(mode))


def graphs_compiled() -> int:
    """torch._dynamo.utils.counters["stats"]["unique_graphs"]: graphs dynamo has handed to a
    backend in this process. torch has no public count of compilations per function; this
    one costs a dict lookup, so it is read around every compiled call."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]
