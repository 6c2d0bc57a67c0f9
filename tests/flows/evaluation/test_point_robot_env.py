"""The point robot as one ``evaluation.env`` among others keeps its figures: on the shipped
sample, a learner trained for 20 meta-steps of ``flows/configs/point_robot.yaml`` gives the
held-out returns and the rollout-picture episodes the evaluation gave before it went through
Gymnasium (numbers printed by that code, revision b17a11e, on this training)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flows.config import load_config
from flows.evaluation.heldout import evaluate
from flows.stages.datasets import validate_datasets
from flows.stages.train import train
from pipeline.synthetic.point_robot import EPISODE_STEPS
from tests.helpers.paths import REPO
from tests.helpers.tolerances import rounding_tolerance

pytestmark = pytest.mark.usefixtures("ray_session")

RETURNS = {
    "unadapted": -15.411670913219451,
    "adapted": -7.862098121838178,
    "expert": -4.519120726371899,
    "behavior": -6.177547907225322,
}
PANELS = {
    "heldout-00034": {
        "unadapted": -23.993680000305176,
        "adapted": -6.351787751540542,
        "expert": -4.385928863262599,
    },
    "heldout-00020": {
        "unadapted": -16.29886555671692,
        "adapted": -7.443356312811375,
        "expert": -5.142648873096108,
    },
    "heldout-00029": {
        "unadapted": -11.902272045612335,
        "adapted": -7.4680419862270355,
        "expert": -4.341222690321415,
    },
    "heldout-00033": {
        "unadapted": -19.08678513765335,
        "adapted": -9.2514328956604,
        "expert": -4.586005992149003,
    },
}
"""Each panel's episode return by policy, in the picture's order."""


def test_point_robot_returns_and_rollouts_stay_as_they_were(tmp_path: Path) -> None:
    cfg = load_config(
        REPO / "flows" / "configs" / "point_robot.yaml",
        [
            f"data.train={REPO / 'data/samples/point_robot/train'}",
            f"data.heldout={REPO / 'data/samples/point_robot/heldout'}",
            "training.iterations=20",
            "training.log_every=10",
            "training.checkpoint_every=20",
            f"training.checkpoint_dir={tmp_path / 'runs'}",
            f"artifacts.root={tmp_path / 'artifacts'}",
        ],
    )
    datasets = validate_datasets(cfg)
    trained = train(cfg, datasets.train, run_dir=tmp_path / "runs" / "local")
    report = evaluate(cfg, trained.learner_state, datasets.heldout)

    # A return sums EPISODE_STEPS float32 rewards (each at most ~2.5 in size): the policy
    # forward may group its float32 operations differently (vmapped rows against a loop),
    # which moves each position, hence each reward, by rounding alone.
    tolerance = float(rounding_tolerance(np.float32, magnitude=2.5, ops=4 * EPISODE_STEPS))
    assert list(report.returns) == list(RETURNS)
    for policy, value in RETURNS.items():
        assert report.returns[policy] == pytest.approx(value, abs=tolerance), policy
    assert report.environment == "point_robot"
    panels = report.trajectories["goals"]
    assert [panel["task_id"] for panel in panels] == list(PANELS)
    for panel in panels:
        returns = {name: run["return"] for name, run in panel["policies"].items()}
        assert list(returns) == list(PANELS[panel["task_id"]])
        for policy, value in PANELS[panel["task_id"]].items():
            assert returns[policy] == pytest.approx(value, abs=tolerance), policy
        assert len(panel["policies"]["adapted"]["positions"]) == EPISODE_STEPS + 1
    # The point robot reports no success: no success rate beside its returns.
    assert report.success is None
    assert report.episode_length == {
        p: float(EPISODE_STEPS) for p in ("unadapted", "adapted", "expert")
    }
