"""Whether a learner's float32 matrix products may run on TF32 tensor cores
(`MetaConfig.float32_matmul`).

torch keeps that choice in one process-wide setting (`torch.set_float32_matmul_precision`).
A learner configured for TF32 on a CUDA device sets it for the length of each of its own
calls and then puts back what it found, so the rest of the process keeps its own choice;
otherwise it leaves the setting alone. TF32 rounds the inputs of each product to a 10-bit
mantissa (about 1e-3 relative error) and runs the products several times faster.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

import torch

T = TypeVar("T")

_UNCHANGED: AbstractContextManager[None] = nullcontext()


def float32_matmul(mode: str, device: torch.device) -> AbstractContextManager[None]:
    """A context in which float32 products follow `mode` ('ieee' or 'tf32') on `device`."""
    return _tf32() if mode == "tf32" and device.type == "cuda" else _UNCHANGED


@contextmanager
def _tf32() -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def with_float32_matmul(method: Callable[..., T]) -> Callable[..., T]:
    """`method` of a learner (with `config.float32_matmul` and `device`) run in
    `float32_matmul` of that learner's setting."""

    @functools.wraps(method)
    def run(self: Any, *args: Any, **kwargs: Any) -> T:
        with float32_matmul(self.config.float32_matmul, self.device):
            return method(self, *args, **kwargs)

    return run
