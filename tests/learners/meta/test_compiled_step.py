"""The compiled meta-step (`MetaConfig.compile`) against the eager reference: the same
updates within rounding, one compilation for meta-batches of one shape, its time logged,
non-finite values halting the learner the same way, states shared with eager learners, and
a logged fallback to eager where a configuration cannot compile.

Compiling takes 15-60 s on the development machine, so one compiled run (a module fixture)
serves every test that needs one.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch
from torch import nn

from learners import HISTORY_METRICS, MetaLearner, NonFiniteGradientError
from learners.training.data_parallel import DataParallelMetaLearner
from tests.helpers.tolerances import largest, rounding_tolerance, trajectory_tolerance

F32 = torch.float32
_STEPS = 3
# Rounded operations behind one meta-gradient entry of a 2-8-1 tanh net, one inner step on
# 5 rows and a query loss on 6 (each a few dot products of at most 8 terms and a mean), and
# the second-order backward pass through both: about 4 * 100 < 500, both computations alike.
_OPS = 500
# Step metrics compared with the eager step's: those kept in a run's history (the learned
# learning rates' among them).
_COMPARED = HISTORY_METRICS


def _config(**overrides: Any) -> dict[str, Any]:
    module = {"obs_dim": 2, "action_dim": 1, "model": {"hidden_sizes": [8], "activation": "tanh"}}
    config = {
        "modules": {"m": module},
        "algorithm": "metasgd",
        "inner": {"lr": 0.1, "learned_lr": "tensor"},
        "outer": {"lr": 0.01, "clip_norm": 5.0},
    }
    config.update(overrides)
    return config


def _meta_batch(seed: int, *, nan_in_support: bool = False, tasks: int = 4) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part(rows: int) -> dict:
        obs = torch.rand(tasks, rows, 2, generator=g) * 4 - 2
        return {"m": {"obs": obs, "actions": torch.sin(obs.sum(-1, keepdim=True))}}

    batch = {"support": part(5), "query": part(6)}
    if nan_in_support:
        batch["support"]["m"]["actions"][2, 0, 0] = float("nan")
    return batch


class CompiledRun(NamedTuple):
    compiled: MetaLearner
    eager: MetaLearner
    metrics: list[tuple[dict, dict]]
    """(compiled, eager) step metrics, step by step."""
    compile_logs: list[str]
    state: dict
    """The compiled learner's state after the good steps."""
    failure: str
    """What `check_finite` raised after a non-finite step."""


@pytest.fixture(scope="module")
def run() -> Iterator[CompiledRun]:
    yield _compiled_run()
    # Compiled code keeps its tracing objects (functorch wrappers among them) until dynamo's
    # caches go; later tests that walk every live tensor must not meet them.
    torch._dynamo.reset()
    gc.collect()


def _compiled_run() -> CompiledRun:
    compiled = MetaLearner(_config(compile="default"))
    eager = MetaLearner(_config())
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("learners.meta.compiled_step")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        metrics = [(compiled.step(_meta_batch(0)), eager.step(_meta_batch(0)))]
        # Every later step must reuse the compiled code: a recompilation would raise (and
        # the learner would fall back to eager, which the tests see).
        with torch.compiler.set_stance("fail_on_recompile"):
            for seed in range(1, _STEPS):
                batch = _meta_batch(seed)
                metrics.append((compiled.step(batch), eager.step(batch)))
            state = compiled.get_state()
            compiled.step(_meta_batch(_STEPS, nan_in_support=True))
            compiled.step(_meta_batch(_STEPS + 1))
    finally:
        logger.removeHandler(handler)
    with pytest.raises(NonFiniteGradientError) as error:
        compiled.check_finite()
    logs = [r.getMessage() for r in records]
    return CompiledRun(compiled, eager, metrics, logs, state, str(error.value))


def _atol(learner: MetaLearner, steps: int) -> float:
    leaves = [*learner.meta_params["m"].values(), *learner.log_lrs.values()]
    return trajectory_tolerance(
        F32,
        steps=steps,
        step_size=learner.config.outer.lr,
        params_magnitude=largest(leaves),
        ops=_OPS,
    )


def test_the_compiled_step_equals_the_eager_one(run: CompiledRun) -> None:
    state, eager = run.state, run.eager.get_state()
    atol = _atol(run.eager, _STEPS)
    for module_id, named in eager["params"].items():
        for name, p in named.items():
            torch.testing.assert_close(state["params"][module_id][name], p, rtol=0, atol=atol)
    for key, log_lr in eager["log_lrs"].items():
        torch.testing.assert_close(state["log_lrs"][key], log_lr, rtol=0, atol=atol)
    assert state["weights_seq_no"] == eager["weights_seq_no"] == _STEPS
    for mine, theirs in zip(
        state["optimizer"]["state"].values(), eager["optimizer"]["state"].values(), strict=True
    ):
        assert torch.equal(mine["step"], theirs["step"])
        for name in ("exp_avg", "exp_avg_sq"):
            # Moments of meta-gradients that differ by rounding: as many operations deep.
            atol = rounding_tolerance(F32, magnitude=largest([theirs[name]]) + 1, ops=_OPS)
            torch.testing.assert_close(mine[name], theirs[name], rtol=0, atol=atol)
    for compiled, reference in run.metrics:
        assert compiled.keys() == reference.keys()
        assert compiled["num_tasks"] == reference["num_tasks"] == 4
        for key in _COMPARED:
            atol = rounding_tolerance(F32, magnitude=float(reference[key]) + 1, ops=_OPS)
            torch.testing.assert_close(compiled[key], reference[key], rtol=0, atol=atol)


def test_one_compilation_serves_every_meta_batch_of_one_shape_and_its_time_is_logged(
    run: CompiledRun,
) -> None:
    step = run.compiled.compiled_step
    assert step.fallback is None
    assert step.compilations == 1
    assert step.compile_seconds > 0
    assert len(run.compile_logs) == 1
    assert run.compile_logs[0].startswith("compiled the meta-step (mode 'default', 4 tasks) in ")
    assert run.compile_logs[0].endswith(" s; 1 compilation(s) so far")


def test_a_nonfinite_inner_gradient_halts_the_compiled_learner_until_the_check(
    run: CompiledRun,
) -> None:
    assert run.failure == (
        "non-finite inner gradient for module 'm': met in 1 of 4 tasks at weights_seq_no 3; "
        "lower inner.lr, set inner.clip_norm, or choose inner.nonfinite 'skip' or 'zero'"
    )
    assert run.compiled.weights_seq_no == _STEPS
    for name, p in run.state["params"]["m"].items():
        assert torch.equal(run.compiled.meta_params["m"][name], p)


def test_a_compiled_learners_state_resumes_an_eager_one_and_back(run: CompiledRun) -> None:
    eager = MetaLearner.from_state(
        {**run.state, "config": {**run.state["config"], "compile": "off"}}
    )
    assert eager.compiled_step is None
    compiled = MetaLearner(_config(compile="default"))
    compiled.set_state(run.eager.get_state())  # compile is not part of what must match
    assert compiled.weights_seq_no == eager.weights_seq_no == _STEPS
    atol = _atol(run.eager, _STEPS)
    for name, p in eager.meta_params["m"].items():
        torch.testing.assert_close(compiled.meta_params["m"][name], p, rtol=0, atol=atol)


def _eager_twins(caplog: pytest.LogCaptureFixture, learner: MetaLearner, reference: MetaLearner):
    for seed in range(2):
        learner.step(_meta_batch(seed))
        reference.step(_meta_batch(seed))
    for name, p in reference.meta_params["m"].items():
        assert torch.equal(learner.meta_params["m"][name], p)
    return [r.getMessage() for r in caplog.records if r.name == "learners.meta.compiled_step"]


def test_the_per_task_loop_runs_eager_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    learner = MetaLearner(_config(vectorize="loop", compile="default"))
    messages = _eager_twins(caplog, learner, MetaLearner(_config(vectorize="loop")))
    reason = "the per-task loop (vectorize='loop') runs eager; compile vmaps"
    assert learner.compiled_step.fallback == reason
    assert messages == [f"MetaConfig.compile='default': {reason}; the meta-step runs eager"]


def test_macaw_runs_eager_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    config = {
        "algorithm": "macaw",
        "compile": "default",
        "modules": {
            "default_policy": {
                "obs_dim": 2,
                "action_dim": 2,
                "model": {"head": "mean_advantage"},
            },
            "value": {"obs_dim": 2, "action_dim": 1},
        },
    }
    learner = MetaLearner(config)
    reason = "algorithm 'macaw' (two inner phases) runs eager; compile covers one"
    assert learner.compiled_step.fallback == reason
    messages = [r.getMessage() for r in caplog.records if r.name == "learners.meta.compiled_step"]
    assert messages == [f"MetaConfig.compile='default': {reason}; the meta-step runs eager"]


def test_data_parallel_learners_run_eager_and_say_why() -> None:
    learner = DataParallelMetaLearner(_config(compile="reduce-overhead"))
    assert learner.compiled_step.fallback == (
        "DataParallelMetaLearner overrides compute_meta_gradients, which the compiled step "
        "(one function from meta-batch to update) would bypass"
    )


class _GraphBreaking(nn.Module):
    """A model torch.compile cannot capture whole (it asks for a graph break)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return self.linear(obs)


def test_a_model_that_cannot_compile_falls_back_to_eager_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    torch.manual_seed(0)
    model = _GraphBreaking()
    learner = MetaLearner(_config(compile="default"), models={"m": model})
    reference = MetaLearner(_config(), models={"m": model})
    messages = _eager_twins(caplog, learner, reference)
    fallback = learner.compiled_step.fallback
    assert fallback is not None and fallback.startswith("compiling the meta-step failed: ")
    assert len(messages) == 1
    assert messages[0] == f"MetaConfig.compile='default': {fallback}; the meta-step runs eager"
