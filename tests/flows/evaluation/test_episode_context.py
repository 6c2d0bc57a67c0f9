"""Episodes as context, with every algorithm: training on support sets of episodes, held-out
adaptation on the held-out task's recorded episodes (``evaluation.context: offline``) or on
exploration episodes in its environment (``online``, explored with the prior, the
posterior or the library of training tasks' policies), checks before Ray, and a resumed run
with episode supports that ends as an uninterrupted one.

A tiny point robot (6 train and 3 held-out goals, 3 episodes of 20 steps each), networks of
8 units, 3 meta-steps: the tests show what runs and what the report says, not learning.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows.config import ConfigError, MetaTrainConfig, validate_config
from flows.evaluation.heldout import evaluate
from flows.stages.datasets import validate_datasets
from flows.stages.task_checks import check_task_sampling
from flows.stages.train import train
from learners.meta.learner import MetaLearner
from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import PointRobotTasks, generate
from tests.helpers.flow_runs import EPISODE_CONTEXT, tiny_document
from tests.helpers.paths import REPO

pytestmark = pytest.mark.usefixtures("ray_session")

ALGORITHMS = ("maml", "fomaml", "metasgd", "macaw")
EPISODE_STEPS = 20
MACAW = [
    "learners.modules.default_policy.model.head=mean_advantage",
    "learners.modules.value={obs_dim: 2, action_dim: 1, model: {hidden_sizes: [8]}}",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("robot")
    generate(PointRobotTasks(episodes_per_task=3), root, tasks=6, heldout_tasks=3, seed=0)
    return root


def _document(data: Path, work: Path, algorithm: str, *overrides: str) -> dict:
    return tiny_document(
        data,
        work,
        [
            f"learners.algorithm={algorithm}",
            *(MACAW if algorithm == "macaw" else []),
            *EPISODE_CONTEXT,
            *overrides,
        ],
    )


@pytest.mark.timeout(180)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_trains_on_episodes_and_adapts_on_offline_and_online_context(
    data: Path, tmp_path: Path, algorithm: str
) -> None:
    cfg = validate_config(_document(data, tmp_path, algorithm))
    datasets = validate_datasets(cfg)
    trained = train(cfg, datasets.train, run_dir=tmp_path / "runs" / "local")
    assert trained.tasks["support_from"] == "episodes" and trained.tasks["support"] == 20

    offline = evaluate(cfg, trained.learner_state, datasets.heldout)
    assert offline.support == EPISODE_STEPS and offline.tasks == 3
    assert offline.context == (
        "offline: 1 whole recorded episode(s) of 20 steps per task, query from its other episodes"
    )
    assert "context offline: 1 whole recorded episode(s)" in offline.format().splitlines()[0]

    def online_context(*settings: str) -> MetaTrainConfig:
        """The config with two exploration episodes per held-out task, and ``settings``."""
        online = ["evaluation.context=online", "evaluation.context_episodes=2", *settings]
        return validate_config(_document(data, tmp_path, algorithm, *online))

    online = evaluate(online_context(), trained.learner_state, datasets.heldout)
    # The report names the policy that explored (the default: the unadapted one).
    assert online.context == "online: 2 exploration episode(s) x 20 steps per task, prior"
    assert online.support == 2 * EPISODE_STEPS
    assert set(online.returns) >= {"unadapted", "adapted"}
    # The same query transitions, another support set: the unadapted loss is the same.
    assert online.query_loss[0] == pytest.approx(offline.query_loss[0], rel=1e-6)

    # Episode 2 by the policy adapted on episode 1, through this algorithm's own adapt.
    posterior_cfg = online_context("evaluation.context_explore=posterior")
    posterior = evaluate(posterior_cfg, trained.learner_state, datasets.heldout)
    assert posterior.context == "online: 2 exploration episode(s) x 20 steps per task, posterior"
    assert posterior.support == 2 * EPISODE_STEPS
    assert posterior.query_loss[0] == pytest.approx(offline.query_loss[0], rel=1e-6)

    # The training goals' own policies (this algorithm's adapt on their recorded episodes)
    # take turns of 5 steps, 4 a 20-step episode: 6 policies, then twice the best.
    library_cfg = online_context(
        "evaluation.context_explore=library",
        "evaluation.context_score_steps=3",
        "tasks.support_window=5",
    )
    library = evaluate(library_cfg, trained.learner_state, datasets.heldout, train=datasets.train)
    assert library.context == (
        "online: 2 exploration episode(s) per task, library (6 training tasks' policies, 5 "
        "steps each, scored by the mean reward of their last 3; context: the best window)"
    )
    assert library.support == 5 and set(library.returns) >= {"unadapted", "adapted"}


@pytest.mark.timeout(120)
def test_online_context_is_the_unadapted_policy_s_own_episodes(data: Path, tmp_path: Path) -> None:
    from flows.evaluation.environments import heldout_envs
    from flows.evaluation.online_context import collect_online_context
    from pipeline.tasks.samples import task_samples

    cfg = validate_config(
        _document(data, tmp_path, "maml", "evaluation.context=online", "tasks.support_window=7")
    )
    heldout = validate_datasets(cfg).heldout
    learner = MetaLearner(cfg.learners.meta_config())
    samples = task_samples(heldout, episode_support=None, support=5, query=5, gamma=0.99)
    envs = heldout_envs(cfg, heldout)
    context = collect_online_context(cfg, learner, ["heldout-00000"], envs, samples.arrays)
    support = context.support["default_policy"]
    assert context.steps == 7 and context.lengths == [EPISODE_STEPS]
    assert support["obs"].shape == (1, 7, 2) and support["rewards"].dtype == torch.float32
    # Transitions follow each other: each step starts where the last one ended.
    assert torch.equal(support["obs"][0, 1:], support["new_obs"][0, :-1])
    assert set(support) == set(samples.arrays)


def test_online_context_without_an_environment_is_refused_before_ray(tmp_path: Path) -> None:
    sinusoid = REPO / "data" / "samples" / "sinusoid"
    document = tiny_document(sinusoid, tmp_path, ["evaluation.context=online"])
    document["learners"]["modules"]["default_policy"].update(obs_dim=1, action_dim=1)
    cfg = validate_config(document)
    train_info, heldout_info = (
        inspect_episodes(sinusoid / "train"),
        inspect_episodes(sinusoid / "heldout"),
    )
    with pytest.raises(DatasetError) as refused:
        check_task_sampling(cfg, train_info, heldout_info)
    assert str(refused.value) == (
        f"held-out dataset {heldout_info.root}: evaluation.context is online (exploration "
        "episodes in each held-out task's environment), but it has no environment: set "
        "evaluation.env to its env factory, or evaluation.context to offline"
    )


def test_config_refuses_online_without_rollouts_and_a_window_of_transitions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as online:
        validate_config(
            tiny_document(
                tmp_path, tmp_path, ["evaluation.context=online", "evaluation.rollout_episodes=0"]
            )
        )
    assert str(online.value).splitlines()[1:] == [
        "  evaluation: context 'online' collects each held-out task's support set in its "
        "environment and rolls the adapted policy out there, but rollout_episodes is 0: set "
        "rollout_episodes >= 1 or context to offline"
    ]
    with pytest.raises(ConfigError) as window:
        validate_config(tiny_document(tmp_path, tmp_path, ["tasks.support_window=5"]))
    assert str(window.value).splitlines()[1:] == [
        "  tasks: support_window=5 takes steps of support episodes; support_from is "
        "'transitions': set support_from to episodes or drop support_window"
    ]


def test_a_task_with_too_few_episodes_is_refused_in_config_words(
    data: Path, tmp_path: Path
) -> None:
    cfg = validate_config(_document(data, tmp_path, "maml", "tasks.support_episodes=3"))
    train_info = inspect_episodes(data / "train")
    with pytest.raises(DatasetError) as refused:
        check_task_sampling(cfg, train_info, inspect_episodes(data / "heldout"))
    assert str(refused.value) == (
        f"train dataset {train_info.root}: every one of its 6 tasks has too few episodes for "
        "support sets of 3 episodes and 10 query transitions from other episodes: "
        + ", ".join(f"'train-0000{i}' (3 of 3 episodes usable, 60 rows)" for i in range(6))
        + "; expected at least 3 usable episodes per task and at least 10 rows "
        "outside its 3 longest. Lower tasks.support_episodes or tasks.query, remove those tasks"
    )


@pytest.mark.timeout(180)
def test_a_resumed_run_with_episode_supports_ends_as_an_uninterrupted_one(
    data: Path, tmp_path: Path
) -> None:
    window = ["tasks.support_window=6", "training.iterations=6", "training.checkpoint_every=3"]
    cfg = validate_config(_document(data, tmp_path, "maml", *window))
    datasets = validate_datasets(cfg)
    straight = train(cfg, datasets.train, run_dir=tmp_path / "straight")
    first = validate_config(_document(data, tmp_path, "maml", *window, "training.iterations=3"))
    train(first, datasets.train, run_dir=tmp_path / "resumed")
    resumed = train(cfg, datasets.train, run_dir=tmp_path / "resumed")
    assert resumed.resumed_from is not None
    for name, tensor in straight.learner_state["params"]["default_policy"].items():
        assert torch.equal(tensor, resumed.learner_state["params"]["default_policy"][name]), name


def test_too_few_episode_samples_for_a_meta_batch_are_refused(data: Path, tmp_path: Path) -> None:
    cfg = validate_config(_document(data, tmp_path, "maml", "tasks.meta_batch=19"))
    train_info = inspect_episodes(data / "train")
    with pytest.raises(DatasetError) as refused:
        check_task_sampling(cfg, train_info, inspect_episodes(data / "heldout"))
    assert str(refused.value) == (
        f"train dataset {train_info.root}: its tasks give 18 samples of "
        "tasks.support_episodes = 1 episodes per epoch, fewer than one meta-batch of "
        "tasks.meta_batch = 19 samples; lower tasks.meta_batch, tasks.support_episodes, or "
        "add tasks"
    )
