"""Online context explored with the posterior (``evaluation.context_explore``): each
exploration episode after the first is the policy adapted on the earlier episodes' windows,
computed here independently with the learner's ``adapt`` and the consumer's ``predict``, and
differs from the unadapted policy; with one episode both modes give the same support set.

A context learner (it reads rewards, so its adapted policy differs from the unadapted one)
on the tiny point robot, untrained: the tests show who acts, not learning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.config import MetaTrainConfig
from flows.evaluation.environments import heldout_envs
from flows.evaluation.online_context import OnlineContext, collect_online_context
from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from pipeline.consumer import predict
from pipeline.reads.episodes import inspect_episodes
from pipeline.tasks.samples import read_task_samples
from tests.helpers.flow_runs import tiny_config, tiny_point_robot
from tests.helpers.tolerances import largest, rounding_tolerance

WINDOW = 7
TASKS = ["heldout-00000", "heldout-00001"]
CONTEXT_LEARNER = [
    "learners.algorithm=context",
    "learners.modules.default_policy.model.head=deterministic",
    "learners.modules.encoder={obs_dim: 7, action_dim: 8, model: {hidden_sizes: [8]}}",
    "tasks.support_from=episodes",
    f"tasks.support_window={WINDOW}",
    "evaluation.context=online",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_point_robot(tmp_path_factory.mktemp("robot"))


def _collect(data: Path, work: Path, *overrides: str) -> tuple[OnlineContext, MetaLearner]:
    cfg: MetaTrainConfig = tiny_config(data, work, [*CONTEXT_LEARNER, *overrides])
    heldout = inspect_episodes(data / "heldout")
    torch.manual_seed(0)
    learner = MetaLearner(cfg.learners.meta_config())
    samples = read_task_samples(
        heldout, episode_support=None, support=5, query=5, mode="memory", gamma=cfg.data.gamma
    )
    envs = heldout_envs(cfg, heldout)
    return collect_online_context(cfg, learner, TASKS, envs, samples.arrays), learner


@pytest.mark.timeout(60)
def test_each_later_episode_is_the_policy_adapted_on_the_earlier_episodes_windows(
    data: Path, tmp_path: Path
) -> None:
    steps = ["evaluation.context_episodes=3", "evaluation.rollout_adapt_steps=1"]
    context, learner = _collect(data, tmp_path, *steps, "evaluation.context_explore=posterior")
    assert context.describe() == (
        f"online: 3 exploration episode(s) x {WINDOW} steps per task, posterior"
    )
    rows = context.support["default_policy"]
    for episode in (1, 2):
        earlier = {"default_policy": {name: v[:, : episode * WINDOW] for name, v in rows.items()}}
        now = slice(episode * WINDOW, (episode + 1) * WINDOW)
        obs, actions = rows["obs"][:, now], rows["actions"][:, now]
        for task in range(len(TASKS)):
            adapted = learner.adapt(None, task_slice(earlier, task), 1)
            expected = predict(learner, obs[task], params=adapted)
            unadapted = predict(learner, obs[task])
            # An encoder of 7-8-8 over up to 14 transitions, their mean with the prior, then
            # the policy 10-8-8-2 on [obs, latent]: some 100 rounded operations on values the
            # inputs bound; one side batches tasks (vmap) and steps, the other neither.
            read = [earlier["default_policy"][c] for c in ("obs", "actions", "rewards", "new_obs")]
            magnitude = largest([*read, expected])
            tolerance = rounding_tolerance(torch.float32, magnitude=magnitude, ops=100)
            torch.testing.assert_close(actions[task], expected, rtol=0, atol=tolerance)
            assert (actions[task] - unadapted).abs().max() > 100 * tolerance, (episode, task)


@pytest.mark.timeout(60)
def test_one_exploration_episode_gives_the_same_support_in_both_modes(
    data: Path, tmp_path: Path
) -> None:
    prior, _ = _collect(data, tmp_path, "evaluation.context_explore=prior")
    posterior, _ = _collect(data, tmp_path, "evaluation.context_explore=posterior")
    assert prior.describe().endswith(", prior") and posterior.describe().endswith(", posterior")
    assert prior.lengths == posterior.lengths == [20, 20]
    first, second = prior.support["default_policy"], posterior.support["default_policy"]
    assert set(first) == set(second)
    for name, values in first.items():
        assert torch.equal(values, second[name]), name
