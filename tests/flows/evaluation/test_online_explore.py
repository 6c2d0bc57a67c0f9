"""Online context explored with the posterior (``evaluation.context_explore``): each
exploration episode after the first is the policy adapted on the earlier episodes' windows,
computed here independently with the learner's ``adapt`` and the consumer's ``predict``, and
differs from the unadapted policy; with one episode both modes give the same support set.
``refine``: each episode's parameters are the last ones moved ``context_refine_step`` times
towards those adapted on the last episode alone, and the support set is the window of the
episode with the highest return.

A context learner (it reads rewards, so its adapted policy differs from the unadapted one)
on the tiny point robot, untrained: the tests show who acts, not learning.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flows.config import MetaTrainConfig
from flows.evaluation import online_context
from flows.evaluation.environments import heldout_envs
from flows.evaluation.exploration_steps import Recorder
from flows.evaluation.online_context import OnlineContext, collect_online_context
from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from pipeline.consumer import predict
from pipeline.reads.episodes import inspect_episodes
from pipeline.tasks.samples import read_task_samples
from tests.helpers.flow_runs import online_context_learner, tiny_config, tiny_point_robot
from tests.helpers.rollout_spy import recorded_steps, spy_roll_outs
from tests.helpers.tolerances import largest, rounding_tolerance

WINDOW = 7
TASKS = ["heldout-00000", "heldout-00001"]
CONTEXT_LEARNER = online_context_learner(WINDOW)


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


def _window(recorder: Recorder) -> dict[str, dict[str, torch.Tensor]]:
    """One exploration episode's first WINDOW steps as one task's support set."""
    return {"default_policy": recorded_steps(recorder, 0, WINDOW)}


@pytest.mark.timeout(60)
def test_refine_steps_each_belief_and_keeps_the_episode_with_the_highest_return(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = spy_roll_outs(monkeypatch, online_context)  # each episode's recorders, by task
    step = 2.5
    context, learner = _collect(
        data,
        tmp_path,
        "evaluation.context_episodes=3",
        "evaluation.rollout_adapt_steps=1",
        "evaluation.context_explore=refine",
        f"evaluation.context_refine_step={step}",
    )
    assert context.describe() == (
        f"online: 3 exploration episode(s) x {WINDOW} steps per task, refine "
        "(step 2.5; context: the highest-return episode)"
    )
    assert len(ran) == 3 and all(len(rows) == len(TASKS) for rows in ran)
    meta = {name: p.detach() for name, p in learner.meta_params["default_policy"].items()}
    for task in range(len(TASKS)):
        belief = meta
        for episode in (1, 2):
            adapted = learner.adapt(None, _window(ran[episode - 1][task]), 1)["default_policy"]
            belief = {n: belief[n] + step * (adapted[n] - belief[n]) for n in belief}
            recorder = ran[episode][task]
            obs = torch.as_tensor(np.asarray(recorder.steps["obs"]), dtype=torch.float32)
            actions = torch.as_tensor(np.asarray(recorder.steps["actions"]), dtype=torch.float32)
            expected = predict(learner, obs, params={"default_policy": belief})
            # As above, with the step scaling the latent's rounding once per episode.
            magnitude = largest([obs, expected, *belief.values()]) * step**episode
            tolerance = rounding_tolerance(torch.float32, magnitude=magnitude, ops=100)
            torch.testing.assert_close(actions, expected, rtol=0, atol=tolerance)
            assert (actions - predict(learner, obs)).abs().max() > 100 * tolerance
        returns = [float(np.sum(ran[episode][task].steps["rewards"])) for episode in range(3)]
        assert context.returns[3 * task : 3 * task + 3] == pytest.approx(returns)
        best = _window(ran[int(np.argmax(returns))][task])["default_policy"]
        for name, values in best.items():
            found = context.support["default_policy"][name][task]
            torch.testing.assert_close(found.reshape(values.shape).float(), values)
