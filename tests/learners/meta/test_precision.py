"""`MetaConfig.float32_matmul`: TF32 only inside a CUDA learner's own calls, the process-wide
setting put back after each, and never on the CPU. (The CUDA side runs in test_cuda.py.)"""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from learners import MetaLearner
from learners.meta.precision import float32_matmul

_CONFIG = {"modules": {"m": {"obs_dim": 1, "action_dim": 1, "model": {"hidden_sizes": [4]}}}}


def _meta_batch() -> dict:
    x = torch.linspace(-1, 1, 12).reshape(2, 6, 1)
    part = {"m": {"obs": x, "actions": torch.sin(x)}}
    return {"support": part, "query": part}


def test_tf32_changes_nothing_on_the_cpu() -> None:
    before = torch.get_float32_matmul_precision()
    with float32_matmul("tf32", torch.device("cpu")):
        assert torch.get_float32_matmul_precision() == before
    tf32 = MetaLearner({**_CONFIG, "float32_matmul": "tf32"})
    ieee = MetaLearner(_CONFIG)
    tf32.step(_meta_batch())
    ieee.step(_meta_batch())
    for name, p in ieee.meta_params["m"].items():
        assert torch.equal(tf32.meta_params["m"][name], p)
    assert torch.get_float32_matmul_precision() == before


def test_the_setting_is_put_back_even_when_the_call_fails() -> None:
    torch.set_float32_matmul_precision("medium")
    try:
        with (
            pytest.raises(RuntimeError, match="inside"),
            float32_matmul("tf32", torch.device("cuda")),
        ):
            assert torch.get_float32_matmul_precision() == "high"
            raise RuntimeError("inside")
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision("highest")


def test_states_resume_across_the_setting_and_bad_values_are_refused() -> None:
    state = MetaLearner({**_CONFIG, "float32_matmul": "tf32"}).get_state()
    MetaLearner(_CONFIG).set_state(state)  # how products round is not what is optimised
    with pytest.raises(ValidationError, match="float32_matmul\n  Input should be 'ieee' or 'tf32'"):
        MetaLearner({**_CONFIG, "float32_matmul": "bf16"})
