"""The context learner on the committed point-robot sample (the goal is not observed; the
rewards tell it), and a consumer of a published context learner in a fresh process without
the training packages."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch

from learners import MetaLearner
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import learner_state_files, predict
from pipeline.reads.episodes import inspect_episodes
from pipeline.streams.collate import finalize
from pipeline.tasks.samples import read_task_samples
from tests.helpers.fresh_python import fresh_python
from tests.helpers.paths import REPO

pytestmark = pytest.mark.system  # 1,500 meta-steps, and a fresh interpreter

SAMPLE = REPO / "data" / "samples" / "point_robot"
CONFIG = {
    "algorithm": "context",
    "context": {"latent_dim": 8},
    "modules": {
        "default_policy": {"obs_dim": 2, "action_dim": 2, "model": {"hidden_sizes": [64, 64]}},
        "encoder": {"obs_dim": 7, "action_dim": 8, "model": {"hidden_sizes": [64, 64]}},
    },
}


def _meta_batch(samples, tasks: int, seed: int) -> dict:
    batch, _ = samples.one_per_task(tasks, seed=seed)
    return finalize(batch, "cpu")


@pytest.mark.timeout(600)
def test_on_the_point_robot_the_adapted_policy_beats_the_prior() -> None:
    train = read_task_samples(inspect_episodes(SAMPLE / "train"), support=10, query=10)
    heldout = read_task_samples(inspect_episodes(SAMPLE / "heldout"), support=10, query=10)
    learner = MetaLearner(CONFIG)
    for step in range(1500):
        learner.step(_meta_batch(train, 20, seed=step), support_loss_after=False)
    curve = learner.evaluate(_meta_batch(heldout, 50, seed=0), steps=(0, 1))
    # The prior can only clone the mean action over goals; the latent tells the goal.
    assert curve[1] < 0.5 * curve[0], curve


@pytest.mark.timeout(600)
def test_a_consumer_in_a_fresh_process_predicts_what_training_predicts(tmp_path: Path) -> None:
    samples = read_task_samples(inspect_episodes(SAMPLE / "heldout"), support=10, query=10)
    learner = MetaLearner(CONFIG)
    for seed in range(2):
        learner.step(_meta_batch(samples, 5, seed=seed))
    state = learner.get_state()
    store = ArtifactStore(tmp_path / "store", durable=False)
    store.publish(
        "context",
        state["params"],
        metrics={},
        config=learner.config,
        lineage={},
        files=learner_state_files(state),
    )
    support = _meta_batch(samples, 1, seed=7)["support"]
    one_task = {m: {c: t[0] for c, t in cols.items()} for m, cols in support.items()}
    obs = torch.linspace(-1, 1, 8).reshape(4, 2)
    expected = predict(learner, obs, params=learner.adapt(None, one_task))
    inputs = {"support": {c: t.tolist() for c, t in one_task["default_policy"].items()}}
    (tmp_path / "inputs.json").write_text(json.dumps({**inputs, "obs": obs.tolist()}))
    probe = textwrap.dedent(
        f"""
        import importlib.abc, json, sys

        class NotInstalled(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {{"ray", "prefect", "pyarrow"}}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, NotInstalled())
        import torch

        # As the test process (tests/conftest.py): another thread count may split a matrix
        # product's sums differently and change the last bit.
        torch.set_num_threads(1)
        from pipeline.consumer import load_learner, predict

        given = json.loads(open({str(tmp_path / "inputs.json")!r}).read())
        learner = load_learner("context@latest", root={(tmp_path / "store").as_uri()!r})
        support = {{c: torch.tensor(v) for c, v in given["support"].items()}}
        adapted = learner.adapt(None, {{"default_policy": support}})
        print(json.dumps(predict(learner, torch.tensor(given["obs"]), params=adapted).tolist()))
        """
    )
    # A fresh interpreter imports torch: seconds, or minutes on a loaded machine.
    found = torch.tensor(json.loads(fresh_python(probe, timeout=300)))
    assert torch.equal(found, expected)
