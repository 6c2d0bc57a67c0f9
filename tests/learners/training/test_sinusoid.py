"""Sinusoid smoke test on the shipped sample: MAML learns an initialisation that adapts.

Reads `data/samples/sinusoid/{train,heldout}` with plain pyarrow (the learners do not depend
on `pipeline`), groups the 20 points of each task, and trains with the MAML paper's settings
for 5k meta-iterations (1-40-40-1 ReLU, 25 tasks, K=10, one inner step at lr 0.01, Adam 1e-3).
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from learners import MetaLearner
from tests.helpers.paths import REPO

pytestmark = pytest.mark.system  # a long run: 5,000 meta-iterations

SAMPLE = REPO / "data" / "samples" / "sinusoid"
POINTS, K = 20, 10


def _tasks(split: str) -> tuple[np.ndarray, np.ndarray]:
    """x and y shaped [tasks, 20, 1], one row per task_id."""
    files = sorted((SAMPLE / split).glob("*.parquet"))
    assert files, f"no Parquet files in {SAMPLE / split}"
    table = pq.read_table(files[0]) if len(files) == 1 else pq.ParquetDataset(files).read()
    obs = table.column("obs").combine_chunks().to_numpy_ndarray().astype(np.float32)
    actions = table.column("actions").combine_chunks().to_numpy_ndarray().astype(np.float32)
    _, task = np.unique(np.asarray(table.column("task_id").to_pylist()), return_inverse=True)
    counts = np.bincount(task)
    assert (counts == POINTS).all(), (
        f"{split}: tasks with {sorted(set(counts))} points, expected 20"
    )
    order = np.argsort(task, kind="stable")
    shape = (len(counts), POINTS, 1)
    return obs[order].reshape(shape), actions[order].reshape(shape)


def _meta_batch(x: np.ndarray, y: np.ndarray) -> dict:
    def part(rows: slice) -> dict:
        obs, actions = torch.from_numpy(x[:, rows]), torch.from_numpy(y[:, rows])
        return {"default_policy": {"obs": obs, "actions": actions}}

    return {"support": part(slice(0, K)), "query": part(slice(K, POINTS))}


@pytest.fixture
def one_thread():
    """Kernels this small gain nothing from a second intra-op thread, and on a busy 2-core
    machine that thread mostly waits to be scheduled: measured 7-9 ms per meta-step with one
    thread against 48-183 ms with two under load."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_maml_sinusoid_adapts_after_5k_meta_iterations(one_thread):
    x_train, y_train = _tasks("train")
    x_held, y_held = _tasks("heldout")
    learner = MetaLearner({"algorithm": "maml", "seed": 0})  # defaults: the paper's settings
    held_out = _meta_batch(x_held, y_held)
    before = learner.evaluate(held_out, steps=(0, 1, 10))

    rng = np.random.default_rng(0)
    for _ in range(5000):
        tasks = rng.choice(len(x_train), size=25, replace=False)
        # A fresh support/query split of each task's 20 points every time it is drawn.
        order = rng.permuted(np.tile(np.arange(POINTS), (25, 1)), axis=1)[..., None]
        xs = np.take_along_axis(x_train[tasks], order, axis=1)
        ys = np.take_along_axis(y_train[tasks], order, axis=1)
        learner.step(_meta_batch(xs, ys))

    after = learner.evaluate(held_out, steps=(0, 1, 10))
    print(f"held-out query MSE before {before}, after 5k meta-iterations {after}")
    assert before[0] > 2.0
    assert after[1] < 0.8
    assert after[10] < 0.3
    assert learner.weights_seq_no == 5000
