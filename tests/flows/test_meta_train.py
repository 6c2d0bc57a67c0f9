"""The meta_train flow end to end under a Prefect test server: ``offmeta run`` publishes a
version with the right lineage and Prefect artifacts; a training task that fails once resumes
from its checkpoint and ends with the parameters of an uninterrupted run; warm start records
the parent."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest
import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
)

from flows.cli import main
from flows.meta_train import meta_train, meta_train_from_file
from flows.runs.run_dirs import read_run
from flows.stages.publishing import prefect_artifact_keys
from learners.meta.learner import MetaLearner
from pipeline.artifacts import ArtifactStore, Lineage
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.flow_runs import FirstRun, tiny_config, tiny_document, write_config
from tests.helpers.paths import REPO
from tests.helpers.published_pictures import PICTURES

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_session")

REPO = REPO


@dataclass
class OneFailure:
    """The meta-step that reaches iteration ``at`` fails once, as a lost device would."""

    at: int | None = None
    failures: int = 0


@pytest.fixture
def one_failure(monkeypatch: pytest.MonkeyPatch) -> OneFailure:
    failure = OneFailure()
    step = MetaLearner.step

    def failing_step(self: MetaLearner, meta_batch: dict, **options: bool) -> dict:
        if failure.at == self.weights_seq_no + 1 and failure.failures == 0:
            failure.failures += 1
            raise RuntimeError(f"injected failure of meta-step {failure.at}")
        return step(self, meta_batch, **options)

    monkeypatch.setattr(MetaLearner, "step", failing_step)
    return failure


def test_offmeta_run_prints_the_evaluation_table_and_the_reference(first_run: FirstRun) -> None:
    lines = first_run.stdout.strip().splitlines()
    assert lines[0] == (
        "held-out evaluation: 4 tasks, K=5 support / Q=5 query transitions, "
        "context offline: 5 random transitions per task, 2 point_robot episodes per task"
    )
    measures = [line.split("  ")[0] for line in lines[3:10]]
    assert measures == [
        "query loss, before adaptation",
        "query loss, after 1 step",
        "query loss, after 5 steps",
        "query loss, after 10 steps",
        "return, unadapted",
        "return, adapted (2 steps)",
        "return, expert",
    ]
    manifest_path = first_run.work / "artifacts" / "names" / "tiny-robot" / "versions"
    assert lines[-1] == (f"published tiny-robot:1: {(manifest_path / '00000001.json').as_uri()}")


def test_the_published_version_records_its_lineage(first_run: FirstRun) -> None:
    manifest = first_run.manifest
    lineage = manifest.lineage
    assert lineage.dataset_fingerprint == inspect_episodes(first_run.data / "train").fingerprint
    assert lineage.parent is None
    assert lineage.weights_seq_no == 12
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.strip()
    assert lineage.code_version.removesuffix("+dirty") == head
    assert manifest.config == tiny_config(first_run.data, first_run.work).model_dump(mode="json")
    assert manifest.metrics["iterations"] == 12
    assert {
        "history.json",
        *(f"{picture}.{kind}" for picture in PICTURES for kind in ("png", "json")),
    } <= set(manifest.files)
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(UUID(lineage.flow_run_id))
    assert flow_run.state.is_completed()
    run_dir = first_run.work / "runs" / lineage.flow_run_id
    assert lineage.subflow_run_id is None  # offmeta run triggers meta-train itself
    assert lineage.extras["checkpoint"] == (run_dir / "checkpoints" / "ckpt-00000012").as_uri()
    assert read_run(run_dir).finished["artifact"] == "tiny-robot:1"


def test_a_deployment_run_records_the_triggered_flow_run_and_an_absolute_checkpoint(
    first_run: FirstRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a prefect.yaml deployment runs: meta-train-from-file, with meta-train as its
    # subflow, in a working directory the relative paths of the config are relative to.
    monkeypatch.chdir(tmp_path)
    write_config(tmp_path / "nightly.yaml", tiny_document(first_run.data, tmp_path))
    state = meta_train_from_file(
        "nightly.yaml", ["training.checkpoint_dir=runs"], return_state=True
    )
    summary = state.result()
    triggered = str(state.state_details.flow_run_id)
    assert triggered != summary.flow_run_id
    lineage = ArtifactStore(tmp_path / "artifacts").get(summary.artifact).lineage
    assert (lineage.flow_run_id, lineage.subflow_run_id) == (triggered, summary.flow_run_id)
    run_dir = tmp_path / "runs" / summary.flow_run_id
    assert lineage.extras["checkpoint"] == (run_dir / "checkpoints" / "ckpt-00000012").as_uri()
    # Manifests published before the subflow field existed still read.
    assert Lineage.model_validate({"flow_run_id": triggered}).subflow_run_id is None


def test_prefect_shows_the_version_as_link_table_markdown_and_progress(
    first_run: FirstRun,
) -> None:
    flow_run_id = UUID(first_run.manifest.lineage.flow_run_id)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    by_key = {artifact.key: artifact for artifact in artifacts}
    keys = prefect_artifact_keys("tiny-robot")
    assert {by_key[keys[kind]].type for kind in ("link", "table", "markdown", "progress")} == {
        "markdown",  # link artifacts are stored as markdown
        "table",
        "progress",
    }
    assert first_run.manifest.spec in by_key[keys["link"]].data
    assert "file://" in by_key[keys["link"]].data
    assert "query loss, before adaptation" in by_key[keys["table"]].data
    markdown = by_key[keys["markdown"]].data
    assert "# tiny-robot:1" in markdown
    for picture in PICTURES:
        assert f"- `{picture}.png` (" in markdown and f"data: `{picture}.json`)" in markdown
    root = first_run.work / "artifacts"
    assert (
        f"They are files of `tiny-robot:1` in the artifact store `{root}`; write them out with "
        f"`offmeta artifacts export tiny-robot:1 DIR --root {root}`."
    ) in markdown
    assert by_key[keys["progress"]].data == 100.0


def test_refused_input_fails_the_run_before_anything_is_written(
    first_run: FirstRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    document = tiny_document(
        first_run.data, tmp_path, ["learners.modules.default_policy.obs_dim=3"]
    )
    config = write_config(tmp_path / "bad.yaml", document)
    assert main(["run", "--config", str(config)]) == 1
    # Refused by the CLI's check before the flow (and Ray, Prefect) starts: one line.
    assert capsys.readouterr().err == (
        f"offmeta run: train dataset {first_run.data / 'train'}: "
        "observations have shape [2] (2 values) but learners.modules.default_policy.obs_dim "
        "is 3; expected obs_dim: 2\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_a_retried_training_task_resumes_from_its_checkpoint(
    first_run: FirstRun, tmp_path: Path, one_failure: OneFailure
) -> None:
    cfg = tiny_config(first_run.data, tmp_path)
    one_failure.at = 10
    summary = meta_train(cfg)
    # Attempt 1 checkpointed at 4 and 8 and failed at step 10; attempt 2 resumed at 8.
    assert one_failure.failures == 1
    assert summary.resumed_from == 8
    store = ArtifactStore(tmp_path / "artifacts")
    manifest = store.get(summary.artifact)
    assert manifest.lineage.extras["resumed_from_iteration"] == 8
    assert manifest.lineage.weights_seq_no == 12
    resumed = store.load_params(summary.artifact)["default_policy"]
    straight = first_run.store.load_params("tiny-robot:1")["default_policy"]
    assert resumed.keys() == straight.keys()
    for name in straight:
        assert torch.equal(resumed[name], straight[name]), name
    assert store.read_file(summary.artifact, "history.json") == first_run.store.read_file(
        "tiny-robot:1", "history.json"
    )
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[UUID(summary.flow_run_id)]))
        )
    train_run = next(run for run in task_runs if run.task_key.startswith("train"))
    assert train_run.state.is_completed()
    assert train_run.run_count == 2


def test_warm_start_continues_from_latest_and_records_the_parent(first_run: FirstRun) -> None:
    cfg = tiny_config(first_run.data, first_run.work, ["training.warm_start=true"])
    summary = meta_train(cfg)
    assert summary.parent == "tiny-robot:1"
    manifest = first_run.store.get(summary.artifact)
    assert manifest.version >= 2
    assert manifest.lineage.parent == "tiny-robot:1"
    assert manifest.lineage.weights_seq_no == 24
    assert [m.spec for m in first_run.store.lineage(summary.artifact)][-1] == "tiny-robot:1"
    # The adaptation picture shows this version against the parent it started from.
    adaptation = json.loads(first_run.store.read_file(summary.artifact, "adaptation.json"))
    parent = json.loads(first_run.store.read_file("tiny-robot:1", "evaluation.json"))
    assert [c["label"] for c in adaptation["curves"]] == ["this version", "parent tiny-robot:1"]
    assert adaptation["curves"][0]["mean"] == list(summary.evaluation.query_loss.values())
    assert adaptation["curves"][1]["mean"] == list(parent["query_loss"].values())
    assert adaptation["curves"][1]["per_task"] == parent["query_loss_per_task"]


def test_the_flow_gives_the_library_its_training_data(tmp_path: Path) -> None:
    from pipeline.synthetic import PointRobotTasks, generate

    data = tmp_path / "robot"
    generate(PointRobotTasks(episodes_per_task=2), data, tasks=6, heldout_tasks=2, seed=0)
    library = [
        "tasks.support_from=episodes",
        "tasks.support_window=5",
        "tasks.query=5",
        "evaluation.context=online",
        "evaluation.context_explore=library",
        "evaluation.context_score_steps=3",
    ]
    summary = meta_train(tiny_config(data, tmp_path, library))
    # One 20-step episode holds 4 turns of 5 steps: 4 of the 6 training goals' policies ran.
    assert summary.evaluation.context == (
        "online: 1 exploration episode(s) per task, library (4 training tasks' policies, 5 "
        "steps each, scored by the mean reward of their last 3; context: the best window)"
    )
