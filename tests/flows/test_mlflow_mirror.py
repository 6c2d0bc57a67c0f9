"""``offmeta run`` with ``artifacts.mlflow`` set: the run publishes ``NAME:1`` in offmeta and
version 1 of the registered model in MLflow at ``@latest``, with metrics and pictures, and the
pyfunc model predicts what ``load_learner`` does. With the server stopped the run still
succeeds, reports the version as not mirrored (last line, log, Prefect), and the backfill
command it prints brings it over."""

from __future__ import annotations

import contextlib
import io
import shlex
from pathlib import Path
from uuid import UUID

import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.cli import main
from flows.stages.publishing import prefect_artifact_keys
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import load_learner, predict
from tests.helpers.flow_runs import tiny_document, tiny_point_robot, write_config
from tests.helpers.mlflow_server import MlflowServer, unused_uri

pytestmark = [pytest.mark.usefixtures("prefect_harness", "ray_session"), pytest.mark.timeout(300)]


def _run(config: Path) -> tuple[int, str]:
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(["run", "--config", str(config)])
    return status, stdout.getvalue()


def test_a_run_mirrors_its_version_and_an_outage_is_backfilled_later(
    mlflow_tracking: MlflowServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = tiny_point_robot(tmp_path / "point_robot")
    work = tmp_path / "work"
    work.mkdir()
    mirror = ["artifacts.mlflow.experiment=flow-tests", "artifacts.mlflow.retry_delay_s=0"]
    document = tiny_document(
        data, work, [*mirror, f"artifacts.mlflow.tracking_uri={mlflow_tracking.uri}"]
    )
    status, stdout = _run(write_config(work / "run.yaml", document))
    assert status == 0, stdout
    assert stdout.splitlines()[-1] == (
        "mirrored to MLflow: tiny-robot:1 -> tiny-robot version 1; aliases @latest -> 1"
    )
    store = ArtifactStore(work / "artifacts")
    manifest = store.get("tiny-robot:1")
    mlflow = MlflowClient(tracking_uri=mlflow_tracking.uri, registry_uri=mlflow_tracking.uri)
    version = mlflow.get_model_version_by_alias("tiny-robot", "latest")
    assert (str(version.version), version.tags["offmeta.version"]) == ("1", "1")
    run = mlflow.get_run(version.run_id)
    assert run.data.tags["offmeta.flow_run_id"] == manifest.lineage.flow_run_id
    assert (
        run.data.metrics["heldout_query_loss_0_steps"]
        == manifest.metrics["heldout_query_loss_0_steps"]
    )
    steps = [m.step for m in mlflow.get_metric_history(run.info.run_id, "query_loss")]
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    pictures = {a.path for a in mlflow.list_artifacts(run.info.run_id, "pictures")}
    assert {"pictures/adaptation.png", "pictures/rollouts.png", "pictures/learning_curve.png"} <= (
        pictures
    )

    import mlflow as mlflow_module

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_tracking.uri)
    model = mlflow_module.pyfunc.load_model("models:/tiny-robot@latest")
    obs = np.array([[0.1, -0.2], [0.5, 0.3]], dtype=np.float32)
    learner = load_learner("tiny-robot@latest", root=work / "artifacts")
    assert np.array_equal(model.predict(obs), predict(learner, torch.from_numpy(obs)).numpy())
    monkeypatch.delenv("MLFLOW_TRACKING_URI")

    # The server is away: the run still publishes tiny-robot:2 and says how to backfill it.
    stopped = tiny_document(data, work, [*mirror, f"artifacts.mlflow.tracking_uri={unused_uri()}"])
    stopped["artifacts"]["mlflow"]["attempts"] = 2
    status, stdout = _run(write_config(work / "stopped.yaml", stopped))
    assert status == 0, stdout
    last = stdout.splitlines()[-1]
    assert last.startswith(
        "not mirrored to MLflow: tiny-robot:2 is published in offmeta, but the mirror failed "
        "after 2 attempts (MlflowException: "
    ), last
    backfill = last.split("backfill it with: ", 1)[1]
    assert store.list_versions("tiny-robot") == [1, 2]
    flow_run_id = UUID(store.get("tiny-robot:2").lineage.flow_run_id)
    with get_client(sync_client=True) as prefect:
        artifacts = prefect.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    report = {a.key: a.data for a in artifacts}[prefect_artifact_keys("tiny-robot")["mlflow"]]
    assert report.startswith("# tiny-robot:2: not mirrored to MLflow")
    assert f"Backfill it (idempotent) with `{backfill}`." in report

    command = shlex.split(backfill)
    assert command[:6] == ["offmeta", "artifacts", "mirror", "tiny-robot:2", "--to", "mlflow"]
    uri_at = command.index("--tracking-uri") + 1
    command[uri_at] = mlflow_tracking.uri  # the server is back
    capsys.readouterr()
    assert main(command[1:]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "@latest -> 2"
    version = mlflow.get_model_version_by_alias("tiny-robot", "latest")
    assert (str(version.version), version.tags["offmeta.version"]) == ("2", "2")
