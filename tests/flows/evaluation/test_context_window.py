"""``evaluation.context_window``: a held-out task's recorded context longer (or shorter)
than training's support window, and what the config and the checks refuse.

The tiny point robot of ``test_episode_context`` (6 train and 3 held-out goals, 3 episodes of
20 steps each), trained 3 meta-steps on 6-step windows: the tests show the shapes and words
of the context, not learning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flows.config import ConfigError, validate_config
from flows.evaluation.heldout import evaluate
from flows.stages.datasets import validate_datasets
from flows.stages.task_checks import check_task_sampling
from flows.stages.train import train
from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import PointRobotTasks, generate
from pipeline.tasks.episodes import EpisodeSupport, episode_steps
from tests.helpers.flow_runs import EPISODE_CONTEXT, tiny_document

pytestmark = pytest.mark.usefixtures("ray_session")

EPISODE_STEPS = 20
WINDOW = 6


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("robot")
    generate(PointRobotTasks(episodes_per_task=3), root, tasks=6, heldout_tasks=3, seed=0)
    return root


def _document(data: Path, work: Path, *overrides: str) -> dict:
    return tiny_document(
        data,
        work,
        [*EPISODE_CONTEXT, f"tasks.support_window={WINDOW}", *overrides],
    )


@pytest.mark.timeout(180)
def test_the_held_out_context_takes_the_window_it_is_given(data: Path, tmp_path: Path) -> None:
    cfg = validate_config(_document(data, tmp_path))
    datasets = validate_datasets(cfg)
    trained = train(cfg, datasets.train, run_dir=tmp_path / "runs")
    assert trained.tasks["support"] == WINDOW

    def evaluated(*overrides: str):
        return evaluate(
            validate_config(_document(data, tmp_path, *overrides)),
            trained.learner_state,
            datasets.heldout,
        )

    # Unset: training's window.
    default = evaluated()
    assert default.support == WINDOW
    assert default.context == (
        "offline: 6-step windows of 1 recorded episode(s) per task, query from its other episodes"
    )
    whole = evaluated("evaluation.context_window=whole")
    assert whole.support == EPISODE_STEPS
    assert whole.context == (
        "offline: 1 whole recorded episode(s) of 20 steps per task, query from its other episodes"
    )
    assert evaluated("evaluation.context_window=15").support == 15
    # The same learner adapts on any length of context: a mean over its steps.
    assert np.isfinite(whole.query_loss[1]) and whole.returns is not None

    # Online exploration episodes keep training's window.
    online = evaluated(
        "evaluation.context=online",
        "evaluation.context_episodes=2",
        "evaluation.context_window=whole",
    )
    assert online.context == "online: 2 exploration episode(s) x 6 steps per task, prior"
    assert online.support == 2 * WINDOW


def test_a_context_window_longer_than_the_held_out_episodes_is_refused_by_its_key(
    data: Path, tmp_path: Path
) -> None:
    cfg = validate_config(_document(data, tmp_path, "evaluation.context_window=21"))
    heldout = inspect_episodes(data / "heldout")
    with pytest.raises(DatasetError) as refused:
        check_task_sampling(cfg, inspect_episodes(data / "train"), heldout)
    assert str(refused.value) == (
        f"held-out dataset {heldout.root}: every one of its 3 tasks has too few episodes for "
        "support sets of 1 episode of at least 21 steps and 10 query transitions from other "
        "episodes: "
        + ", ".join(f"'heldout-0000{i}' (0 of 3 episodes usable, 60 rows)" for i in range(3))
        + "; expected at least 1 usable episodes per task and at least 10 rows outside its 1 "
        "longest. Lower tasks.support_episodes, evaluation.context_window or tasks.query, "
        "remove those tasks"
    )


def test_whole_episodes_of_different_lengths_name_the_setting_that_windows_them() -> None:
    with pytest.raises(DatasetError) as refused:
        episode_steps(
            EpisodeSupport(1),
            np.array([20, 25]),
            "held-out dataset d",
            window_key="evaluation.context_window: W",
        )
    assert str(refused.value) == (
        "held-out dataset d: whole episodes as support sets need every episode to have one "
        "length (vmap stacks them), but the episodes have 20 to 25 steps; take W consecutive "
        "steps of each support episode instead (evaluation.context_window: W)"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "  evaluation.context_window: expected an int >= 1, 'whole' or null, got 0"),
        ("true", "  evaluation.context_window: expected an int >= 1, 'whole' or null, got True"),
        ("all", "  evaluation.context_window: expected an int >= 1, 'whole' or null, got 'all'"),
    ],
)
def test_a_malformed_context_window_is_refused(tmp_path: Path, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        validate_config(_document(tmp_path, tmp_path, f"evaluation.context_window={value}"))
    assert str(refused.value).splitlines()[1:] == [message]


def test_a_context_window_needs_context_episodes(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        validate_config(tiny_document(tmp_path, tmp_path, ["evaluation.context_window=whole"]))
    assert str(refused.value).splitlines()[1:] == [
        "  <config>: evaluation.context_window='whole' takes steps of a held-out task's context "
        "episodes; tasks.support_from is 'transitions': set tasks.support_from to episodes or "
        "drop evaluation.context_window"
    ]
