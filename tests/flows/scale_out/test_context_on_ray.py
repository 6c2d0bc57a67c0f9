"""The context learner on two Ray Train workers, with support sets made of whole episodes:
the run ends where one in-process learner drawing both workers' tasks ends (the workers'
M/2 tasks per step together are that learner's M), and it publishes like any other run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.config import load_config
from flows.scale_out import train_on_ray
from flows.stages.train import train
from pipeline.reads.episodes import read_episodes
from tests.helpers.paths import REPO
from tests.helpers.tolerances import largest, trajectory_tolerance

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("ray_session")]

ITERATIONS, TASKS_PER_STEP = 6, 8
# Rounded operations behind one meta-gradient entry of the 64-64 encoder and policy over 20
# support and 10 query rows: dot products of at most 64 terms, the codes summed over 20 rows,
# forward and backward through encoder and policy, the mean over tasks and workers: < 2,000.
_OPS = 2_000


def _config(root: Path, *, learners: int):
    overrides = {
        "data.train": str(REPO / "data/samples/point_robot/train"),
        "data.heldout": str(REPO / "data/samples/point_robot/heldout"),
        "tasks.support_from": "episodes",
        "tasks.support_episodes": 1,
        "tasks.query": 10,
        "tasks.meta_batch": TASKS_PER_STEP // max(learners, 1),
        "learners.num_learners": learners,
        "training.iterations": ITERATIONS,
        "training.log_every": 2,
        "training.history_points": ITERATIONS // 2,
        "training.checkpoint_every": 3,
        "training.checkpoint_dir": str(root / f"runs-{learners}"),
        "artifacts.root": str(root / "artifacts"),
    }
    return load_config(
        REPO / "flows/configs/point_robot_context.yaml",
        [f"{key}={value}" for key, value in overrides.items()],
    )


@pytest.mark.timeout(300)
def test_two_workers_train_the_context_learner_on_episodes_as_one_learner_does(tmp_path):
    train_data = read_episodes(REPO / "data/samples/point_robot/train")
    one = _config(tmp_path, learners=0)
    reference = train(one, train_data, run_dir=tmp_path / "one")

    two = _config(tmp_path, learners=2)
    result = train_on_ray(two, train_data, run_dir=tmp_path / "two")

    assert (result.restarts, result.num_learners, result.iterations) == (0, 2, ITERATIONS)
    assert result.weights_seq_no == reference.weights_seq_no == ITERATIONS
    for module, expected_params in reference.learner_state["params"].items():
        atol = trajectory_tolerance(
            torch.float32,
            steps=ITERATIONS,
            step_size=one.learners.outer.lr,
            params_magnitude=largest(expected_params.values()),
            ops=_OPS,
        )
        for name, expected in expected_params.items():
            found = result.learner_state["params"][module][name]
            torch.testing.assert_close(found, expected, rtol=0, atol=atol, msg=f"{module}.{name}")
    assert result.history["iteration"] == reference.history["iteration"] == [2, 4, 6]
