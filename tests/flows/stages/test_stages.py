"""The flow's stages as plain functions and through ``task.fn()`` (no Prefect server)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from flows.evaluation.heldout import EvaluationReport
from flows.meta_train import (
    _transient,
    evaluate_learner,
    publish_result,
    train_learner,
    validate_dataset,
)
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import LEARNER_JSON, LEARNER_TENSORS, load_learner
from pipeline.contract.schema import DatasetError
from pipeline.synthetic import SinusoidTasks, generate
from tests.helpers.flow_runs import tiny_config, tiny_point_robot
from tests.helpers.published_pictures import check_published_pictures

pytestmark = pytest.mark.usefixtures("ray_session")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_point_robot(tmp_path_factory.mktemp("point_robot"))


def test_the_four_stages_run_through_task_fn(data: Path, tmp_path: Path) -> None:
    cfg = tiny_config(data, tmp_path)
    datasets = validate_dataset.fn(cfg)
    assert datasets.summary()["train"]["tasks"] == 12
    assert datasets.summary()["heldout"]["tasks"] == 4

    trained = train_learner.fn(cfg, datasets, str(tmp_path / "runs" / "local"))
    checkpoints = tmp_path / "runs" / "local" / "checkpoints"
    assert trained.checkpoint == checkpoints / "ckpt-00000012"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["ckpt-00000008", "ckpt-00000012"]
    assert trained.iterations == trained.weights_seq_no == 12
    assert trained.resumed_from is None and trained.parent is None
    # history_points (100) exceeds the 12 iterations: a point after every one.
    assert trained.history["iteration"] == list(range(1, 13))
    assert {name: len(values) for name, values in trained.history.items()} == {
        "iteration": 12,
        "query_loss": 12,
        "support_loss_before": 12,
        "support_loss_after": 12,
        "grad_norm": 12,
    }
    assert trained.final_metrics["query_loss"] == trained.history["query_loss"][-1]
    assert "iteration" not in trained.final_metrics

    report = evaluate_learner.fn(cfg, trained, datasets)
    assert report.tasks == 4
    assert list(report.query_loss) == [0, 1, 5, 10]
    assert list(report.returns) == ["unadapted", "adapted", "expert", "behavior"]
    # The behaviour data's mean episode return: every held-out reward once, per episode.
    rewards = pq.read_table(datasets.heldout.files[0], columns=["rewards"]).column("rewards")
    behavior = float(np.asarray(rewards, dtype=np.float64).sum()) / datasets.heldout.num_episodes
    assert report.returns["behavior"] == pytest.approx(behavior, rel=1e-12)
    assert (report.environment, report.rollout_episodes, report.rollout_adapt_steps) == (
        "point_robot",
        2,
        2,
    )

    ref = publish_result.fn(cfg, trained, report, datasets, "local")
    store = ArtifactStore(cfg.artifacts.root)
    manifest = store.get(str(ref))
    assert str(ref) == "tiny-robot:1"
    assert manifest.lineage.dataset_fingerprint == datasets.train.fingerprint
    assert manifest.lineage.flow_run_id is None
    assert manifest.lineage.weights_seq_no == 12
    assert manifest.lineage.extras["heldout_fingerprint"] == datasets.heldout.fingerprint
    assert manifest.config == cfg.model_dump(mode="json")
    assert manifest.metrics["heldout_query_loss_0_steps"] == report.query_loss[0]
    assert manifest.metrics["train_query_loss"] == trained.final_metrics["query_loss"]
    assert {"history.json", "learning_curve.png", LEARNER_TENSORS, LEARNER_JSON} <= set(
        manifest.files
    )
    check_published_pictures(store, ref, trained, report)
    # The attached learner state rebuilds the learner, learned state and all.
    rebuilt = load_learner(str(ref), root=cfg.artifacts.root)
    assert rebuilt.get_state()["optimizer"]["state"]
    for name, tensor in store.load_params(ref)["default_policy"].items():
        assert torch.equal(rebuilt.meta_params["default_policy"][name], tensor)


def test_macaw_trains_evaluates_and_publishes_through_the_stages(
    data: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(
        data,
        tmp_path,
        [
            "learners.algorithm=macaw",
            "learners.inner={}",
            "learners.modules.default_policy.model.head=mean_advantage",
            "learners.modules.value={obs_dim: 2, action_dim: 1, model: {hidden_sizes: [8]}}",
            "evaluation.rollout_adapt_steps=1",
        ],
    )
    datasets = validate_dataset.fn(cfg)
    trained = train_learner.fn(cfg, datasets, str(tmp_path / "runs" / "local"))
    assert trained.weights_seq_no == 12
    assert trained.tasks["modules"] == ["default_policy"]  # the value function reads its rows
    report = evaluate_learner.fn(cfg, trained, datasets)
    assert list(report.returns) == ["unadapted", "adapted", "expert", "behavior"]
    # The rollouts picture runs the policy, not the value function (two modules trained).
    assert report.trajectories is not None and report.trajectories["goals"]
    ref = publish_result.fn(cfg, trained, report, datasets, "local")
    store = ArtifactStore(cfg.artifacts.root)
    manifest = store.get(str(ref))
    assert manifest.config["learners"]["algorithm"] == "macaw"
    check_published_pictures(store, ref, trained, report)
    learner = load_learner(str(ref), root=cfg.artifacts.root)
    assert sorted(learner.meta_params) == ["default_policy", "value"]


def test_a_critic_must_declare_the_observation_size_of_the_rows_it_reads(
    data: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(
        data,
        tmp_path,
        [
            "learners.algorithm=macaw",
            "learners.modules.default_policy.model.head=mean_advantage",
            "learners.modules.value={obs_dim: 3, action_dim: 1}",
        ],
    )
    with pytest.raises(DatasetError) as error:
        validate_dataset.fn(cfg)
    assert str(error.value) == (
        f"train dataset {data / 'train'}: observations have shape [2] (2 values) but "
        "learners.modules.value.obs_dim is 3; expected obs_dim: 2"
    )


def test_a_module_that_does_not_fit_the_data_is_refused(data: Path, tmp_path: Path) -> None:
    cfg = tiny_config(data, tmp_path, ["learners.modules.default_policy.obs_dim=3"])
    with pytest.raises(DatasetError) as caught:
        validate_dataset.fn(cfg)
    assert str(caught.value) == (
        f"train dataset {data / 'train'}: observations have shape [2] (2 values) but "
        "learners.modules.default_policy.obs_dim is 3; expected obs_dim: 2"
    )
    cfg = tiny_config(data, tmp_path, ["learners.modules={agent: {obs_dim: 2, action_dim: 2}}"])
    with pytest.raises(DatasetError) as caught:
        validate_dataset.fn(cfg)
    assert str(caught.value) == (
        f"train dataset {data / 'train'} has no rows of module 'agent', which learners.modules "
        "trains; its modules are ['default_policy'] (rename the module in the config, or list "
        "the ones to train in learners.modules_to_update)"
    )


def test_held_out_tasks_of_another_family_are_refused(data: Path, tmp_path: Path) -> None:
    other = tmp_path / "sinusoid"
    generate(SinusoidTasks(), other, tasks=2, heldout_tasks=2)
    cfg = tiny_config(data, tmp_path, [f"data.heldout={other / 'heldout'}"])
    with pytest.raises(DatasetError) as caught:
        validate_dataset.fn(cfg)
    assert str(caught.value) == (
        f"held-out dataset {other / 'heldout'}: obs_shape is [1] but the train dataset "
        f"{data / 'train'} has [2]; expected held-out tasks of the same task family "
        "(data.heldout must match data.train)"
    )


def test_partial_episodes_pass_only_with_the_data_option(data: Path, tmp_path: Path) -> None:
    [train] = sorted((data / "train").glob("*.parquet"))
    rows = pq.read_table(train)
    partial = tmp_path / "partial" / train.name
    partial.parent.mkdir()
    pq.write_table(rows.slice(6), partial)
    cfg = tiny_config(data, tmp_path, [f"data.train={partial.parent}"])
    with pytest.raises(DatasetError, match=r"eps_id 0 starts at t 6; expected every episode"):
        validate_dataset.fn(cfg)
    allowed = ["data.allow_partial_episodes=true", f"data.train={partial.parent}"]
    datasets = validate_dataset.fn(tiny_config(data, tmp_path, allowed))
    assert datasets.train.num_rows == rows.num_rows - 6


@pytest.mark.parametrize(
    ("error", "retried"),
    [
        (RuntimeError("worker died"), True),
        (OSError("disk full"), True),
        (DatasetError("bad file"), False),
        (TypeError("bad batch"), False),
        (NotImplementedError("num_learners"), False),
        (FloatingPointError("non-finite meta-gradient"), False),
    ],
)
def test_only_transient_failures_are_retried(error: Exception, retried: bool) -> None:
    from prefect.states import Failed

    assert _transient(None, None, Failed(data=error)) is retried  # type: ignore[arg-type]


def test_the_report_table_compares_with_before_adaptation() -> None:
    report = EvaluationReport(
        tasks=50,
        support=10,
        query=10,
        query_loss={0: 0.004, 1: 0.002, 5: 0.001},
        returns={"unadapted": -15.0, "adapted": -6.5, "expert": -4.5},
        environment="point_robot",
        rollout_episodes=10,
        rollout_adapt_steps=5,
    )
    assert report.format() == "\n".join(
        [
            "held-out evaluation: 50 tasks, K=10 support / Q=10 query transitions, "
            "context offline: random transitions, 10 point_robot episodes per task",
            "measure                        value  change",
            "-----------------------------  -----  ------",
            "query loss, before adaptation  0.004",
            "query loss, after 1 step       0.002  -50.0%",
            "query loss, after 5 steps      0.001  -75.0%",
            "return, unadapted                -15",
            "return, adapted (5 steps)       -6.5    +8.5",
            "return, expert                  -4.5   +10.5",
        ]
    )
    assert report.summary() == (
        "held-out evaluation on 50 tasks: query loss 0.004 before adaptation, 0.002 after 1 "
        "step, 0.001 after 5 steps; return unadapted -15, adapted -6.5, expert -4.5"
    )
    assert report.metrics() == {
        "heldout_query_loss_0_steps": 0.004,
        "heldout_query_loss_1_steps": 0.002,
        "heldout_query_loss_5_steps": 0.001,
        "heldout_return_unadapted": -15.0,
        "heldout_return_adapted": -6.5,
        "heldout_return_expert": -4.5,
    }


def test_the_report_shows_the_behaviour_data_beside_the_policies() -> None:
    report = EvaluationReport(
        tasks=40,
        support=20,
        query=20,
        query_loss={0: 17.0, 1: 13.0},
        returns={"unadapted": -20.0, "adapted": -10.0, "expert": -4.5, "behavior": -13.3},
        environment="point_robot",
        rollout_episodes=10,
        rollout_adapt_steps=1,
    )
    assert report.format().splitlines()[-3:] == [
        "return, adapted (1 step)         -10     +10",
        "return, expert                  -4.5   +15.5",
        "return, behavior data          -13.3    +6.7",
    ]
    assert report.metrics()["heldout_return_behavior"] == -13.3
