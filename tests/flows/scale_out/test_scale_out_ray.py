"""Two Ray Train workers, one killed mid-run: the run restarts from its last checkpoint,
finishes every iteration, and ends where one in-process learner with both workers' tasks
ends (the workers' M/2 tasks per step together are that learner's M)."""

from __future__ import annotations

import pytest
import torch

from flows.config import validate_config
from flows.evaluation.heldout import evaluate
from flows.scale_out import WorkerFault, train_on_ray
from flows.stages.datasets import Datasets
from flows.stages.publishing import publish
from flows.stages.train import train
from pipeline.artifacts import ArtifactStore
from pipeline.reads.episodes import read_episodes
from pipeline.synthetic import SinusoidTasks, generate
from tests.helpers.tolerances import largest, rounding_tolerance, trajectory_tolerance

pytestmark = pytest.mark.system

ITERATIONS, TASKS_PER_STEP = 8, 8
# Rounded operations behind one meta-gradient of the 1-40-40-1 net (one inner step on 5 rows,
# 5 query rows): about 200 per pass (dot products of 40 terms), a forward and a backward pass
# for the inner step and again for the query loss, the second-order pass retracing both, and
# the mean over tasks and workers: under 1,000.
_OPS = 1_000


def _config(root, *, learners: int, run: str):
    return validate_config(
        {
            "data": {
                "train": str(root / "data" / "train"),
                "heldout": str(root / "data" / "heldout"),
            },
            # 16 tasks of 20 points give 32 samples of 5 + 5: 4 steps per epoch, so the
            # run crosses an epoch and the restart resumes a stream mid-way.
            "tasks": {"support": 5, "query": 5, "meta_batch": TASKS_PER_STEP // max(learners, 1)},
            "learners": {"num_learners": learners, "outer": {"lr": 0.01}},
            "training": {
                "iterations": ITERATIONS,
                "log_every": 2,
                "history_points": ITERATIONS // 2,
                "checkpoint_every": 2,
                "checkpoint_dir": str(root / run),
                "retries": 2,
            },
            "evaluation": {"tasks": 4, "steps": [0, 1]},
            "artifacts": {"name": "scale-out", "root": str(root / "artifacts")},
        }
    )


@pytest.fixture(scope="module")
def datasets(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("scale")
    generate(SinusoidTasks(), root / "data", tasks=16, heldout_tasks=4, seed=0)
    return root, Datasets(
        train=read_episodes(root / "data" / "train"),
        heldout=read_episodes(root / "data" / "heldout"),
    )


@pytest.mark.timeout(300)
def test_a_killed_worker_restarts_and_the_run_matches_one_learner(datasets):
    root, data = datasets
    reference = train(_config(root, learners=0, run="one"), data.train, run_dir=root / "one")

    cfg = _config(root, learners=2, run="two")
    fault = WorkerFault(rank=1, iteration=5)
    result = train_on_ray(cfg, data.train, run_dir=root / "two", fault=fault)

    assert (result.restarts, result.num_learners, result.iterations) == (1, 2, ITERATIONS)
    assert result.resumed_from == 4  # the last checkpoint before the failure
    assert result.weights_seq_no == reference.weights_seq_no == ITERATIONS
    assert result.checkpoint.is_relative_to(root / "two")
    # The data is float32, so is the learner: the two workers' summed gradients differ from
    # one learner's by rounding alone, and so do the parameters they reach.
    expected_params = reference.learner_state["params"]["default_policy"]
    atol = trajectory_tolerance(
        torch.float32,
        steps=ITERATIONS,
        step_size=cfg.learners.outer.lr,
        params_magnitude=largest(expected_params.values()),
        ops=_OPS,
    )
    for name, expected in expected_params.items():
        found = result.learner_state["params"]["default_policy"][name]
        torch.testing.assert_close(found, expected, rtol=0, atol=atol)
    assert result.history.keys() == reference.history.keys()
    # Every worker reduces the metrics at the same history points, merged across workers.
    assert result.history["iteration"] == reference.history["iteration"] == [2, 4, 6, 8]
    # A logged loss or gradient norm (a sum over the 1,761 parameters: under 2,000 more
    # operations) comes from parameters carrying the rounding of every earlier iteration.
    ops = (ITERATIONS + 2) * _OPS
    for metric, curve in reference.history.items():
        assert len(result.history[metric]) == ITERATIONS // 2
        history_atol = rounding_tolerance(torch.float32, magnitude=largest(curve), ops=ops)
        assert result.history[metric] == pytest.approx(curve, rel=0, abs=history_atol), metric
    assert result.final_metrics == {
        name: c[-1] for name, c in result.history.items() if name != "iteration"
    }

    report = evaluate(cfg, result.learner_state, data.heldout)
    ref = publish(cfg, result, report, data, flow_run_id=None, code_version=None)
    store = ArtifactStore(cfg.artifacts.root)
    published = store.load_params(ref, device="cpu")
    for name, tensor in result.learner_state["params"]["default_policy"].items():
        assert torch.equal(published["default_policy"][name], tensor)
    extras = store.get("scale-out").lineage.extras
    assert extras["resumed_from_iteration"] == result.resumed_from
    assert (extras["restarts"], extras["num_learners"]) == (1, 2)
