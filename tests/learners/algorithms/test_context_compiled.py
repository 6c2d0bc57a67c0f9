"""The context learner's compiled meta-step against the eager one (torch.compile takes tens
of seconds on 2 cores: the system tier)."""

from __future__ import annotations

import pytest
import torch

from learners import MetaLearner
from tests.helpers.tolerances import rounding_tolerance
from tests.learners.algorithms.test_context import _OPS, F64, _config, _meta_batch

pytestmark = pytest.mark.system


def test_the_compiled_step_matches_the_hand_written_loop() -> None:
    config = _config(True, compile="default")
    eager, compiled = MetaLearner(_config(True)), MetaLearner(config)
    meta_batch = _meta_batch()
    expected = eager.step(meta_batch)
    found = compiled.step(meta_batch)
    assert compiled.compiled_step is not None and compiled.compiled_step.fallback is None
    tolerance = rounding_tolerance(F64, magnitude=float(expected["query_loss"]) + 1, ops=_OPS)
    assert abs(float(found["query_loss"]) - float(expected["query_loss"])) <= tolerance
    for module, named in eager.meta_params.items():
        for name, p in named.items():
            assert torch.allclose(compiled.meta_params[module][name], p, rtol=0, atol=tolerance)
