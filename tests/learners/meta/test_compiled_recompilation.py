"""Compiled meta-steps are never shared between learners: a learner whose config differs from
another's only in a value the compiled step closes over compiles its own code, and a meta-batch
of another shape compiles once more.

System tier: three compilations of the meta-step take 40-90 s on the 2-core development
machine (a long run the source does not show; docs/development.md#tiers).
"""

from __future__ import annotations

import gc

import pytest
import torch

from learners import MetaLearner
from tests.helpers.tolerances import rounding_tolerance
from tests.learners.meta.test_compiled_step import _COMPARED, _OPS, _atol, _config, _meta_batch

pytestmark = pytest.mark.system

F32 = torch.float32


def test_learners_of_the_same_shapes_never_run_each_others_compiled_code_and_shapes_do() -> None:
    first = MetaLearner(_config(compile="default"))
    try:
        first.step(_meta_batch(0))
        # The compiled step checks no guard on the learner it closes over (its config among
        # them): a learner differing only there must compile its own code, not reuse the
        # first one's (same function, same shapes). Guards on the tensors stay: a meta-batch
        # of another shape compiles once more.
        config = _config(compile="default", inner={"lr": 0.3, "learned_lr": "tensor"})
        compiled, eager = MetaLearner(config), MetaLearner({**config, "compile": "off"})
        for steps, batch in enumerate((_meta_batch(0), _meta_batch(1, tasks=3)), start=1):
            mine, reference = compiled.step(batch), eager.step(batch)
            assert compiled.compiled_step.compilations == steps
            for key in _COMPARED:
                atol = rounding_tolerance(F32, magnitude=float(reference[key]) + 1, ops=_OPS)
                torch.testing.assert_close(mine[key], reference[key], rtol=0, atol=atol)
            atol = _atol(eager, steps)
            for name, p in eager.meta_params["m"].items():
                torch.testing.assert_close(compiled.meta_params["m"][name], p, rtol=0, atol=atol)
        assert first.compiled_step.compilations == 1
    finally:
        # Compiled code keeps its tracing objects until dynamo's caches go (see
        # tests/learners/meta/test_compiled_step.py).
        torch._dynamo.reset()
        gc.collect()
