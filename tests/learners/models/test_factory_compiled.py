"""The compiled meta-step (`MetaConfig.compile`) over a factory network with GroupNorm: the
same updates as eager within rounding, from one compilation.

System tier: compiling this step takes 30-60 s on the 2-core development machine (a long run
the source does not show; docs/development.md#tiers).
"""

from __future__ import annotations

import gc

import pytest
import torch

from learners import MetaLearner
from tests.helpers.tolerances import largest, trajectory_tolerance
from tests.learners.models.test_factory import _OPS, _config, _meta_batch

pytestmark = pytest.mark.system


def test_the_compiled_step_with_a_factory_equals_the_eager_one():
    config = _config(algorithm="metasgd", dtype="float32", outer={"lr": 0.01})
    compiled = MetaLearner({**config, "compile": "default"})
    eager = MetaLearner(config)
    try:
        for seed in range(3):
            batch = _meta_batch(seed=seed, dtype=torch.float32)
            compiled.step(batch)
            eager.step(batch)
        assert compiled.compiled_step.fallback is None
        assert compiled.compiled_step.compilations == 1
        leaves = [*eager.meta_params["m"].values(), *eager.log_lrs.values()]
        atol = trajectory_tolerance(
            torch.float32, steps=3, step_size=0.01, params_magnitude=largest(leaves), ops=_OPS
        )
        for name, p in eager.meta_params["m"].items():
            torch.testing.assert_close(compiled.meta_params["m"][name], p, rtol=0, atol=atol)
    finally:
        # Compiled code keeps its tracing objects until dynamo's caches go (see
        # tests/learners/meta/test_compiled_step.py).
        torch._dynamo.reset()
        gc.collect()
