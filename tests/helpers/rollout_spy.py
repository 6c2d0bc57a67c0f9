"""A spy on a module's ``roll_out`` (the environments of every call, in order), and the
steps an exploration episode's recorder kept, as tensors."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch

READ = ("obs", "actions", "rewards", "new_obs")
"""The columns the tests' context learner reads."""


def spy_roll_outs(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[list[Any]]:
    """Replace ``module.roll_out`` for the test with one that records each call's
    environments (an exploration episode's recorders, in task order) and then rolls out."""
    calls: list[list[Any]] = []
    real = module.roll_out

    def recording(envs: list[Any], policy: Any, **kwargs: Any) -> Any:
        calls.append(list(envs))
        return real(envs, policy, **kwargs)

    monkeypatch.setattr(module, "roll_out", recording)
    return calls


def recorded_steps(recorder: Any, start: int, stop: int) -> dict[str, torch.Tensor]:
    """Steps ``[start, stop)`` of ``recorder``'s episode, the columns of ``READ``, float32."""
    return {
        name: torch.as_tensor(np.asarray(recorder.steps[name][start:stop]), dtype=torch.float32)
        for name in READ
    }
