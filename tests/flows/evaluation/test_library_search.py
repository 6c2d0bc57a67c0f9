"""Online context explored with the library (``evaluation.context_explore: library``): the
training tasks' policies, each adapted on its recorded context, act one window each in turn,
then each held-out task's best-scoring one runs on; the support set is the best-scoring
window. Checked here against the learner's own ``adapt`` (one task at a time) and the
consumer's ``predict``, window by window.

A context learner (it reads rewards, so every training task's policy differs) on a tiny point
robot of 12 training goals with two 20-step episodes each, untrained: the tests show who
acts, not learning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from flows.config import MetaTrainConfig
from flows.evaluation import library_search
from flows.evaluation.environments import heldout_envs
from flows.evaluation.library_search import LibraryTurns
from flows.evaluation.online_context import collect_online_context
from flows.stages.task_checks import context_samples
from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from pipeline.consumer import predict
from pipeline.reads.episodes import inspect_episodes, read_episodes
from pipeline.streams.collate import finalize
from pipeline.synthetic import PointRobotTasks, generate
from pipeline.tasks.samples import read_task_samples
from tests.helpers.flow_runs import online_context_learner, tiny_config
from tests.helpers.rollout_spy import recorded_steps, spy_roll_outs
from tests.helpers.tolerances import largest, rounding_tolerance

WINDOW = 7
EPISODE = 20
EPISODES = 5
SCORE = 3
TASKS = ["heldout-00000", "heldout-00001"]
LIBRARY = [
    *online_context_learner(WINDOW),
    "evaluation.context_explore=library",
    f"evaluation.context_episodes={EPISODES}",
    f"evaluation.context_score_steps={SCORE}",
    f"evaluation.max_episode_steps={EPISODE}",
    "evaluation.rollout_adapt_steps=1",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("robot")
    generate(PointRobotTasks(episodes_per_task=2), root, tasks=12, heldout_tasks=4, seed=0)
    return root


def _setup(data: Path, work: Path) -> tuple[MetaTrainConfig, MetaLearner, Any, Any]:
    cfg: MetaTrainConfig = tiny_config(data, work, LIBRARY)
    torch.manual_seed(0)
    learner = MetaLearner(cfg.learners.meta_config())
    heldout = inspect_episodes(data / "heldout")
    samples = read_task_samples(
        heldout, episode_support=None, support=5, query=5, mode="memory", gamma=cfg.data.gamma
    )
    return cfg, learner, heldout, samples


def _library(cfg: MetaTrainConfig, learner: MetaLearner, data: Path) -> list[dict[str, Any]]:
    """Every training task's policy, adapted one task at a time on the context a held-out
    task would get offline, in the training tasks' order."""
    samples = context_samples(cfg, read_episodes(data / "train"), ["default_policy"])
    batch, ids = samples.one_per_task(100, seed=cfg.evaluation.seed)
    assert len(ids) == 12
    support = finalize(batch, "cpu")["support"]
    return [learner.adapt(None, task_slice(support, i), 1) for i in range(len(ids))]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.timeout(120)
def test_each_training_policy_acts_one_window_then_the_best_and_the_best_window_is_the_context(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = spy_roll_outs(monkeypatch, library_search)
    cfg, learner, heldout, samples = _setup(data, tmp_path)
    context = collect_online_context(
        cfg,
        learner,
        TASKS,
        heldout_envs(cfg, heldout),
        samples.arrays,
        train=read_episodes(data / "train"),
    )
    assert context.describe() == (
        f"online: {EPISODES} exploration episode(s) per task, library (12 training tasks' "
        f"policies, {WINDOW} steps each, scored by the mean reward of their last {SCORE}; "
        "context: the best window)"
    )
    assert context.library == LibraryTurns(policies=12, steps=WINDOW, score_steps=SCORE)
    assert context.steps == WINDOW and len(context.returns) == EPISODES * len(TASKS)
    policies = _library(cfg, learner, data)
    # Windows [0, 7), [7, 14), [14, 20) of each episode: 15, the first 12 one policy each.
    bounds = [(e, a, min(a + WINDOW, EPISODE)) for e in range(EPISODES) for a in (0, 7, 14)]
    assert len(ran) == EPISODES and all(len(rows) == len(TASKS) for rows in ran)
    for task in range(len(TASKS)):
        assert all(ran[e][task].length == EPISODE for e in range(EPISODES))
        scores = [float(np.mean(ran[e][task].steps["rewards"][a:b][-SCORE:])) for e, a, b in bounds]
        best = int(np.argmax(scores[:12]))
        for j, (episode, start, stop) in enumerate(bounds):
            steps = recorded_steps(ran[episode][task], start, stop)
            chosen = policies[j] if j < 12 else policies[best]
            expected = predict(learner, steps["obs"], params=chosen)
            # An encoder of 7-8-8 over up to 20 transitions, their mean with the prior, then
            # the policy 10-8-8-2 on [obs, latent]: some 100 rounded operations on values the
            # inputs bound; one side batches tasks (vmap), the other does not.
            magnitude = largest([steps["obs"], expected])
            tolerance = rounding_tolerance(torch.float32, magnitude=magnitude, ops=100)
            torch.testing.assert_close(steps["actions"], expected, rtol=0, atol=tolerance)
            other = policies[(j + 1) % 12] if j < 12 else policies[(best + 1) % 12]
            wrong = predict(learner, steps["obs"], params=other)
            assert (steps["actions"] - wrong).abs().max() > 10 * tolerance, (task, j)
        episode, start, stop = bounds[int(np.argmax(scores))]
        window = recorded_steps(ran[episode][task], start, stop)
        for name, values in window.items():
            found = context.support["default_policy"][name][task]
            torch.testing.assert_close(found.reshape(values.shape).float(), values)


def test_library_without_the_training_data_is_refused(data: Path, tmp_path: Path) -> None:
    cfg, learner, heldout, samples = _setup(data, tmp_path)
    with pytest.raises(ValueError) as caught:
        collect_online_context(cfg, learner, TASKS, heldout_envs(cfg, heldout), samples.arrays)
    assert str(caught.value) == (
        "evaluation.context_explore 'library' draws its policies from the training tasks: "
        "pass their data (train=)"
    )
