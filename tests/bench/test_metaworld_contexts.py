"""bench/metaworld_contexts.py: the same learner evaluated on several draws of each goal's
recorded context, at each context length given; the reach sample, a tiny learner, short
rollouts (what runs and what it reports, not learning)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.metaworld_contexts import draws, summary
from flows.config import load_config
from flows.stages.datasets import validate_datasets
from flows.stages.train import train
from tests.helpers.paths import REPO

pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore::UserWarning"),  # metaworld's policy gains
]

REACH = REPO / "flows" / "configs" / "metaworld_reach.yaml"
SAMPLE = REPO / "data" / "samples" / "metaworld_reach"


def test_summary_is_the_mean_and_standard_error_over_draws() -> None:
    figures = summary(
        [
            {"success_any": 1.0, "success_final": 0.5, "return": 10.0},
            {"success_any": 0.5, "success_final": 0.5, "return": 20.0},
        ]
    )
    assert figures["success_any"] == (0.75, pytest.approx(0.25))
    assert figures["success_final"] == (0.5, 0.0)
    assert figures["return"] == (15.0, pytest.approx(5.0))


@pytest.mark.usefixtures("ray_session")
def test_each_draw_is_the_run_s_evaluation_at_the_length_given(tmp_path: Path) -> None:
    overrides = [
        f"data.train={SAMPLE / 'train'}",
        f"data.heldout={SAMPLE / 'heldout'}",
        "learners.compile=off",
        "learners.modules.default_policy.model.hidden_sizes=[16]",
        "learners.modules.encoder.model.hidden_sizes=[16]",
        "training.iterations=2",
        "training.checkpoint_every=2",
        f"training.checkpoint_dir={tmp_path}",
        "evaluation.max_episode_steps=10",
    ]
    cfg = load_config(REACH, overrides)
    state = train(cfg, validate_datasets(cfg).train, run_dir=tmp_path / "run").learner_state

    windowed = draws(REACH, overrides, state, "20", 2)
    whole = draws(REACH, overrides, state, "whole", 1)
    assert [m["context"] for m in windowed] == [
        "offline: 20-step windows of 1 recorded episode(s) per task, query from its other episodes"
    ] * 2
    assert whole[0]["context"].startswith("offline: 1 whole recorded episode(s) of 50 steps")
    for measured in (*windowed, *whole):
        assert measured["goals"] == 2
        assert 0 <= measured["success_any"] <= 1 and measured["return"] == measured["return"]
