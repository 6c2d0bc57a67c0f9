"""A spy on a module's ``roll_out``: the environments of every call, in order."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest


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
