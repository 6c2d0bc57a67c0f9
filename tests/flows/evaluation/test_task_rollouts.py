"""Rollouts adapt to every held-out task in one vmapped ``adapt``: the parameters equal each
task's own ``adapt`` up to rounding, and a non-finite update still raises."""

from __future__ import annotations

import pytest
import torch

from flows.evaluation.task_rollouts import adapt_tasks
from learners import MetaLearner, NonFiniteGradientError
from learners.meta.meta_batch import task_slice
from tests.helpers.tolerances import largest, rounding_tolerance, trajectory_tolerance

TASKS, ROWS, STEPS = 6, 10, 5


def _learner(**inner) -> MetaLearner:
    spec = {"obs_dim": 2, "action_dim": 2, "model": {"hidden_sizes": [16, 16]}}
    config = {"modules": {"default_policy": spec}, "inner": {"lr": 0.05, **inner}}
    return MetaLearner(config)


def _support(scale: float = 1.0) -> dict:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(TASKS, ROWS, 2, generator=g) * scale
    actions = torch.randn(TASKS, ROWS, 2, generator=g)
    return {"default_policy": {"obs": obs, "actions": actions}}


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
def test_every_task_is_adapted_as_its_own_adapt_adapts_it(vectorize: str) -> None:
    learner = _learner()
    learner.config = learner.config.model_copy(update={"vectorize": vectorize})
    support = _support()
    adapted = adapt_tasks(learner, "default_policy", support, STEPS)
    for task in range(TASKS):
        alone = learner.adapt(None, task_slice(support, task), STEPS)["default_policy"]
        for name, value in alone.items():
            # SGD steps whose gradients differ by rounding only (batched matmuls against
            # one task's), through a forward and backward pass some 20 operations deep.
            moved = value - learner.meta_params["default_policy"][name]
            tolerance = trajectory_tolerance(
                torch.float32,
                steps=STEPS,
                step_size=largest([moved]),
                params_magnitude=largest([value]),
                ops=20,
            )
            torch.testing.assert_close(adapted[name][task], value, rtol=0, atol=tolerance)


def test_a_non_finite_update_raises_as_adapt_does() -> None:
    learner = _learner(lr=1e30)
    with pytest.raises(NonFiniteGradientError) as raised:
        adapt_tasks(learner, "default_policy", _support(scale=1e20), STEPS)
    assert str(raised.value) == (
        "non-finite inner gradient for module 'default_policy': the updated parameters of "
        f"{TASKS} held-out task(s) are non-finite; lower inner.lr, set inner.clip_norm, or "
        "choose inner.nonfinite 'skip' or 'zero'"
    )


def test_a_context_learner_rolls_out_each_task_with_its_own_latent() -> None:
    modules = {
        "default_policy": {"obs_dim": 2, "action_dim": 2, "model": {"hidden_sizes": [8]}},
        "encoder": {"obs_dim": 7, "action_dim": 3, "model": {"hidden_sizes": [8]}},
    }
    learner = MetaLearner(
        {"algorithm": "context", "context": {"latent_dim": 3}, "modules": modules}
    )
    g = torch.Generator().manual_seed(1)
    rows = {"rewards": torch.randn(TASKS, ROWS, generator=g)}
    rows["new_obs"] = torch.randn(TASKS, ROWS, 2, generator=g)
    support = {"default_policy": {**_support()["default_policy"], **rows}}
    module = learner.config.rollout_module
    adapted = adapt_tasks(learner, module, support, 1)
    for task in range(TASKS):
        alone = learner.adapt(None, task_slice(support, task))[module]
        # The mean of 10 codes of a 7-8-3 net and the prior: some 60 rounded operations on
        # values the inputs bound (the codes of these small weights stay below them).
        values = largest(support["default_policy"].values())
        tolerance = rounding_tolerance(torch.float32, magnitude=values, ops=60)
        torch.testing.assert_close(adapted["latent"][task], alone["latent"], rtol=0, atol=tolerance)
        assert torch.equal(
            adapted["network.layers.0.weight"][task], alone["network.layers.0.weight"]
        )
