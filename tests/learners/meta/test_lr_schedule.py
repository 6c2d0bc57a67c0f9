"""The outer learning rate's schedule (learners.meta.lr_schedule): its factors, what a step
moves, and an exact resume from a saved state in the middle of it."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from learners import MetaLearner
from learners.config import OuterConfig
from learners.meta.lr_schedule import LrSchedule


def _config(outer: dict) -> dict:
    module = {"obs_dim": 2, "action_dim": 1, "model": {"hidden_sizes": [8]}}
    return {"modules": {"m": module}, "inner": {"lr": 0.05}, "outer": outer, "dtype": "float64"}


def _meta_batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part() -> dict:
        return {
            "m": {
                "obs": torch.randn(3, 6, 2, generator=g, dtype=torch.float64),
                "actions": torch.randn(3, 6, 1, generator=g, dtype=torch.float64),
            }
        }

    return {"support": part(), "query": part()}


def test_warm_up_then_cosine_factors() -> None:
    schedule = LrSchedule("cosine", warmup_steps=4, decay_steps=10, min_lr_ratio=0.1)
    factors = [float(schedule.factor(torch.tensor(t))) for t in (0, 1, 3, 4, 9, 14, 100)]
    cosine_half = 0.1 + 0.9 * 0.5  # halfway through the decay
    expected = [0.25, 0.5, 1.0, 1.0, cosine_half, 0.1, 0.1]
    assert factors == pytest.approx(expected, rel=4 * torch.finfo(torch.float64).eps)
    assert LrSchedule("constant", 0, None, 0.0).constant
    assert float(LrSchedule("constant", 2, None, 0.0).factor(torch.tensor(0))) == 0.5


def test_a_warm_up_step_moves_the_parameters_as_the_scaled_rate_does() -> None:
    # 0.1 * 0.25 is exactly the float 0.025: the two first steps are the same arithmetic.
    warm = MetaLearner(_config({"optimizer": "sgd", "lr": 0.1, "warmup_steps": 4}))
    plain = MetaLearner(_config({"optimizer": "sgd", "lr": 0.025}))
    for learner in (warm, plain):
        learner.step(_meta_batch(0))
    for name, p in plain.meta_params["m"].items():
        assert torch.equal(warm.meta_params["m"][name], p)


def test_a_run_resumed_in_the_middle_of_the_schedule_equals_an_uninterrupted_one() -> None:
    outer = {"lr": 0.01, "schedule": "cosine", "warmup_steps": 2, "decay_steps": 4}
    uninterrupted = MetaLearner(_config(outer))
    for seed in range(6):
        uninterrupted.step(_meta_batch(seed))
    first = MetaLearner(_config(outer))
    for seed in range(3):
        first.step(_meta_batch(seed))
    resumed = MetaLearner.from_state(first.get_state())
    for seed in range(3, 6):
        resumed.step(_meta_batch(seed))
    for name, p in uninterrupted.meta_params["m"].items():
        assert torch.equal(resumed.meta_params["m"][name], p)
    constant = MetaLearner(_config({"lr": 0.01}))
    for seed in range(6):
        constant.step(_meta_batch(seed))
    assert not torch.equal(constant.meta_params["m"]["layers.0.weight"], p)


def test_a_cosine_schedule_without_decay_steps_is_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        OuterConfig(schedule="cosine")
    (error,) = caught.value.errors()
    assert error["msg"] == (
        "Value error, outer.schedule 'cosine' decays over outer.decay_steps updates; set it "
        "(e.g. training.iterations minus outer.warmup_steps)"
    )
