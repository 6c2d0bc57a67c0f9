"""The committed pixel sample runs through the four stages of a run with the conv encoder
(validate, train, evaluate, publish; each stage's task function, as the flow calls them):
uint8 images through the task stream and the held-out evaluation, published, and loaded
back by a consumer that adapts on float ``[C, H, W]`` images as finalize gives them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from flows.config import load_config
from flows.meta_train import evaluate_learner, publish_result, train_learner, validate_dataset
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import load_learner, predict
from tests.helpers.paths import REPO

pytestmark = pytest.mark.usefixtures("ray_session")

MODULE = "default_policy"
NAME = "point-robot-pixels-conv-maml"


def test_the_pixel_sample_trains_evaluates_publishes_and_loads(tmp_path: Path) -> None:
    cfg = load_config(
        REPO / "flows" / "configs" / "point_robot_pixels_conv.yaml",
        [
            f"artifacts.root={tmp_path / 'artifacts'}",
            f"training.checkpoint_dir={tmp_path / 'runs'}",
            "training.iterations=4",
            "training.log_every=2",
            "training.checkpoint_every=4",
            "evaluation.tasks=4",
            "evaluation.steps=[0, 1]",
        ],
    )
    datasets = validate_dataset.fn(cfg)
    assert datasets.summary()["train"]["observation_layout"] == "CHW"

    trained = train_learner.fn(cfg, datasets, str(tmp_path / "runs" / "local"))
    assert trained.iterations == 4
    assert all(math.isfinite(loss) for loss in trained.history["query_loss"])
    report = evaluate_learner.fn(cfg, trained, datasets)
    assert report.tasks == 4 and set(report.query_loss) == {0, 1}
    assert all(math.isfinite(loss) for loss in report.query_loss.values())
    # Rolled out in the pixel env (evaluation.env): uint8 frames reach the policy as the
    # training batches do, floats in [0, 1].
    metrics = report.metrics()
    for policy in ("adapted", "unadapted"):
        assert math.isfinite(metrics[f"heldout_return_{policy}"])
        assert 0.0 <= metrics[f"heldout_success_{policy}"] <= 1.0
    ref = publish_result.fn(cfg, trained, report, datasets, "local")

    manifest = ArtifactStore(cfg.artifacts.root).get(str(ref))
    module = manifest.config["learners"]["modules"][MODULE]
    assert (module["obs_shape"], module["model"]["encoder"]) == ([1, 32, 32], "conv")
    learner = load_learner(str(ref), root=cfg.artifacts.root)
    images = torch.rand(10, 1, 32, 32)
    adapted = learner.adapt(None, {MODULE: {"obs": images, "actions": torch.zeros(10, 2)}})
    assert predict(learner, images, params=adapted).shape == (10, 2)
