"""``pipeline.mlflow.mirror`` against a real ``mlflow server`` on loopback: each version becomes a
run (params, step-wise metrics, pictures, lineage tags) and a registered model version tagged
with its offmeta version; re-mirroring creates nothing; aliases follow offmeta's; a stopped
server fails the mirror, and a backfill afterwards brings every version over in order."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient

from flows.cli import main
from learners import MetaLearner
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import learner_state_files
from pipeline.mlflow.mirror import MirrorError, MlflowTarget, flatten_config, mirror
from tests.helpers.mlflow_server import MlflowServer, unused_uri

pytestmark = pytest.mark.timeout(240)

CONFIG = {
    "modules": {
        "default_policy": {"obs_dim": 2, "action_dim": 2, "model": {"hidden_sizes": [8]}},
        "critic": {
            "obs_dim": 2,
            "action_dim": 1,
            "loss": "gaussian_nll",
            "model": {"hidden_sizes": [4], "head": "gaussian"},
        },
    },
    "inner": {"lr": 0.1, "steps": 2},
}
HISTORY = {"iteration": [4, 8, 12], "query_loss": [3.0, 2.0, 1.5], "grad_norm": [1.0, 0.5, 0.25]}
PNG = b"\x89PNG\r\n\x1a\n not really a picture"


def publish(store: ArtifactStore, name: str, seed: int = 0, config: dict = CONFIG) -> str:
    """A version as ``offmeta run`` publishes one: learner state, history, a picture."""
    torch.manual_seed(seed)
    state = MetaLearner(config).get_state()
    ref = store.publish(
        name,
        state["params"],
        metrics={"iterations": 12, "heldout_query_loss_0_steps": 2.5},
        config={"learners": config, "artifacts": {"name": name}},
        lineage={
            "dataset_fingerprint": "sha256:" + "ab" * 32,
            "flow_run_id": "flow-run-1",
            "code_version": "abc123",
            "extras": {"heldout_fingerprint": "sha256:" + "cd" * 32},
        },
        history=HISTORY,
        files=[*learner_state_files(state), ("adaptation.png", PNG), ("adaptation.json", b"{}")],
    )
    return str(ref)


@pytest.fixture
def names() -> Callable[[], str]:
    """Fresh names, so tests sharing the session's server never see each other's models."""
    return lambda: f"policy-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def store(tmp_path: Path) -> ArtifactStore:
    return ArtifactStore(tmp_path / "store", durable=False)


def client(server: MlflowServer) -> MlflowClient:
    return MlflowClient(tracking_uri=server.uri, registry_uri=server.uri)


def test_a_mirrored_version_is_a_run_and_a_registered_version_at_latest(
    mlflow_tracking: MlflowServer, store: ArtifactStore, names: Callable[[], str]
) -> None:
    name = names()
    spec = publish(store, name)
    result = mirror(store, spec, MlflowTarget(mlflow_tracking.uri, "mirror-tests", name))
    assert result.summary() == f"{name}:1 -> {name} version 1; aliases @latest -> 1"

    mlflow = client(mlflow_tracking)
    version = mlflow.get_model_version_by_alias(name, "latest")
    assert str(version.version) == "1"
    manifest = store.get(spec)
    assert version.tags == {
        "offmeta.name": name,
        "offmeta.version": "1",
        "offmeta.digest": manifest.params_digest,
    }
    run = mlflow.get_run(version.run_id)
    assert run.info.run_name == f"{name}:1"
    assert run.info.status == "FINISHED"
    assert run.data.params["learners.inner.lr"] == "0.1"
    assert run.data.params["learners.modules.default_policy.model.hidden_sizes"] == "[8]"
    assert run.data.metrics["heldout_query_loss_0_steps"] == 2.5
    history = mlflow.get_metric_history(run.info.run_id, "query_loss")
    assert [(m.step, m.value) for m in history] == [(4, 3.0), (8, 2.0), (12, 1.5)]
    tags = run.data.tags
    assert tags["offmeta.spec"] == f"{name}:1"
    assert tags["offmeta.dataset_fingerprint"] == "sha256:" + "ab" * 32
    assert tags["offmeta.heldout_fingerprint"] == "sha256:" + "cd" * 32
    assert tags["offmeta.flow_run_id"] == "flow-run-1"
    assert tags["offmeta.code_version"] == "abc123"
    assert "offmeta.parent" not in tags
    pictures = {a.path for a in mlflow.list_artifacts(run.info.run_id, "pictures")}
    assert pictures == {
        "pictures/adaptation.json",
        "pictures/adaptation.png",
        "pictures/learning_curve.json",
        "pictures/learning_curve.png",
    }
    offmeta_files = {a.path for a in mlflow.list_artifacts(run.info.run_id, "offmeta")}
    assert {"offmeta/manifest.json", "offmeta/history.json"} <= offmeta_files
    local = mlflow.download_artifacts(run.info.run_id, "pictures/adaptation.png")
    assert Path(local).read_bytes() == PNG


def test_mirroring_again_creates_no_second_run_or_version(
    mlflow_tracking: MlflowServer, store: ArtifactStore, names: Callable[[], str]
) -> None:
    name = names()
    spec = publish(store, name)
    target = MlflowTarget(mlflow_tracking.uri, f"idempotent-{name}", name)
    first = mirror(store, spec, target)
    again = mirror(store, spec, target)
    assert [v.created for v in first.versions] == [True]
    assert [v.created for v in again.versions] == [False]
    assert again.versions[0].run_id == first.versions[0].run_id
    assert (
        again.summary() == f"{name}:1 -> {name} version 1 (already mirrored); aliases @latest -> 1"
    )
    mlflow = client(mlflow_tracking)
    assert len(mlflow.search_model_versions(f"name = '{name}'")) == 1
    experiment = mlflow.get_experiment_by_name(f"idempotent-{name}")
    assert len(mlflow.search_runs([experiment.experiment_id])) == 1


def test_aliases_follow_offmeta_and_latest_is_offmetas_latest(
    mlflow_tracking: MlflowServer,
    store: ArtifactStore,
    names: Callable[[], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = names()
    publish(store, name, seed=0)
    publish(store, name, seed=1)
    store.set_alias(name, "prod", 1, expected=None)
    target = MlflowTarget(mlflow_tracking.uri, "mirror-tests", name)
    result = mirror(store, name, target)
    assert result.aliases == {"latest": "2", "prod": "1"}
    mlflow = client(mlflow_tracking)
    assert mlflow.get_model_version_by_alias(name, "prod").tags["offmeta.version"] == "1"

    root = str(store.root)
    uri = ["--tracking-uri", mlflow_tracking.uri, "--experiment", "mirror-tests"]
    assert (
        main(["artifacts", "alias", name, "prod", "2", "--root", root, "--to", "mlflow", *uri]) == 0
    )
    assert capsys.readouterr().out.splitlines() == [
        f"{name}@prod: 1 -> 2",
        f"mlflow: {name}:2 -> {name} version 2 (already mirrored); "
        "aliases @latest -> 2, @prod -> 2",
    ]
    assert str(mlflow.get_model_version_by_alias(name, "prod").version) == "2"

    spec = publish(store, name, seed=2)
    mirror(store, spec, target)
    assert mlflow.get_model_version_by_alias(name, "latest").tags["offmeta.version"] == "3"


def test_a_stopped_server_fails_the_mirror_and_a_backfill_brings_every_version_in_order(
    mlflow_tracking: MlflowServer,
    store: ArtifactStore,
    names: Callable[[], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = names()
    spec = publish(store, name, seed=0)
    with pytest.raises(Exception, match=r"127\.0\.0\.1"):
        mirror(store, spec, MlflowTarget(unused_uri(), "mirror-tests", name))
    publish(store, name, seed=1)
    root = str(store.root)
    backfill = ["artifacts", "mirror", name, "--to", "mlflow", "--root", root]
    backfill += ["--tracking-uri", mlflow_tracking.uri, "--experiment", "mirror-tests"]
    assert main(backfill) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" (run ")[0] for line in lines[:2]] == [
        f"{name}:1 -> {name} version 1",
        f"{name}:2 -> {name} version 2",
    ]
    assert [line.endswith(", created)") for line in lines[:2]] == [True, True]
    assert lines[2:] == ["@latest -> 2"]
    assert main(backfill) == 0
    assert [
        line.endswith(", already mirrored)") for line in capsys.readouterr().out.splitlines()[:2]
    ] == [True, True]
    assert len(client(mlflow_tracking).search_model_versions(f"name = '{name}'")) == 2


def test_an_unmirrored_version_older_than_a_mirrored_one_is_refused(
    mlflow_tracking: MlflowServer, store: ArtifactStore, names: Callable[[], str]
) -> None:
    name = names()
    publish(store, name, seed=0)
    publish(store, name, seed=1)
    target = MlflowTarget(mlflow_tracking.uri, "mirror-tests", name)
    mirror(store, name, target)
    client(mlflow_tracking).delete_model_version(name, "1")
    with pytest.raises(MirrorError) as refused:
        mirror(store, f"{name}:1", target)
    assert str(refused.value) == (
        f"refusing to mirror {name}:1: {name}:2 is already {name} version 2, and MLflow's "
        f"@latest is its highest version number, so a version registered now would become "
        f"{name}@latest; versions are mirrored oldest first"
    )


def test_a_version_without_learner_state_is_refused(
    mlflow_tracking: MlflowServer, store: ArtifactStore
) -> None:
    store.publish(
        "bare", {"default_policy": {"w": torch.ones(2)}}, metrics={}, config={}, lineage={}
    )
    with pytest.raises(MirrorError) as refused:
        mirror(store, "bare:1", MlflowTarget(mlflow_tracking.uri, "mirror-tests", "bare"))
    assert str(refused.value) == (
        "bare:1 holds no learner state (no learner_state.safetensors, learner_state.json), "
        "which the MLflow model is made of; only versions that offmeta run published can be "
        "mirrored"
    )


def test_the_tracking_uri_comes_from_the_environment_or_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert MlflowTarget.resolve(None, "e", "m").tracking_uri == "http://127.0.0.1:5000"
    assert MlflowTarget.resolve("http://mlflow:80", "e", "m").tracking_uri == "http://mlflow:80"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    with pytest.raises(MirrorError) as missing:
        MlflowTarget.resolve(None, "e", "m")
    assert str(missing.value) == (
        "no MLflow tracking URI: set artifacts.mlflow.tracking_uri (or --tracking-uri) or the "
        "MLFLOW_TRACKING_URI environment variable"
    )


def test_config_params_are_flat_dotted_keys_with_json_values() -> None:
    assert flatten_config({"a": {"b": 1, "c": [1, 2], "d": {}}, "e": "text", "f w!": None}) == {
        "a.b": "1",
        "a.c": "[1, 2]",
        "a.d": "{}",
        "e": "text",
        "f w_": "null",
    }
