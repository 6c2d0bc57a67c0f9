"""The shipped Meta-World reach config (ignored object features, tasks moved in space, a
cosine learning rate) trains on its committed sample in this process, and a run stopped
half-way resumes to exactly the parameters of an uninterrupted one."""

from __future__ import annotations

import shutil

import pytest
import torch

from flows.config import load_config
from flows.stages.datasets import validate_datasets
from flows.stages.train import train
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(300)

REACH = REPO / "flows" / "configs" / "metaworld_reach.yaml"


def _config(tmp_path, iterations: int):
    return load_config(
        REACH,
        [
            f"data.train={REPO / 'data/samples/metaworld_reach/train'}",
            f"data.heldout={REPO / 'data/samples/metaworld_reach/heldout'}",
            "learners.compile=off",
            "learners.modules.default_policy.model.hidden_sizes=[16]",
            "learners.modules.encoder.model.hidden_sizes=[16]",
            f"training.iterations={iterations}",
            "training.checkpoint_every=2",
            "training.log_every=2",
            "learners.outer.decay_steps=4",
            f"training.checkpoint_dir={tmp_path}",
        ],
    )


@pytest.mark.usefixtures("ray_session")
def test_the_reach_config_trains_and_resumes_exactly(tmp_path) -> None:
    cfg = _config(tmp_path, 4)
    assert cfg.tasks.shift_obs is not None and cfg.data.ignore_obs_features
    data = validate_datasets(cfg).train
    whole = train(cfg, data, run_dir=tmp_path / "whole")
    train(_config(tmp_path, 2), data, run_dir=tmp_path / "stopped")
    shutil.copytree(tmp_path / "stopped", tmp_path / "resumed")
    resumed = train(cfg, data, run_dir=tmp_path / "resumed")
    for module, named in whole.learner_state["params"].items():
        for name, tensor in named.items():
            assert torch.equal(resumed.learner_state["params"][module][name], tensor), name
    stats = whole.learner_state["config"]["modules"]["default_policy"]["input_stats"]
    assert stats["ignored"] == [*range(4, 18), *range(22, 36)]
