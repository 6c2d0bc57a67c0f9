"""The MLflow mirror of a run gives up within ``artifacts.mlflow.timeout_s``, all attempts
together: a refused connection is known at once and tried ``attempts`` times; a server that
accepts connections and never answers costs the timeout, then the version is reported as not
mirrored with its backfill command. Without the bound, MLflow's client retries each request
7 times with backoff and waits 120 s for each answer, so these tests would run into their
pytest timeout instead."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.config import MetaTrainConfig
from flows.stages.mirroring import mirror_published
from pipeline.artifacts import ArtifactStore
from tests.helpers.flow_runs import tiny_config
from tests.helpers.mlflow_server import unused_uri
from tests.helpers.silent_server import silent_server as silent_mlflow
from tests.pipeline.mlflow.test_mirror import publish

pytestmark = pytest.mark.timeout(60)

_LOGGER = logging.getLogger(__name__)


@pytest.fixture(autouse=True)
def mlflow_client_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's own retry and timeout defaults, not the quick ones the test session sets."""
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT", raising=False)


@pytest.fixture
def silent_server() -> Iterator[str]:
    with silent_mlflow() as uri:
        yield uri


def _published(tmp_path: Path, tracking_uri: str, *overrides: str) -> tuple[str, MetaTrainConfig]:
    root = tmp_path / "store"
    ref = publish(ArtifactStore(root, durable=False), "robot")
    cfg = tiny_config(
        tmp_path,
        tmp_path,
        [
            f"artifacts.root={root}",
            "artifacts.name=robot",
            f"artifacts.mlflow.tracking_uri={tracking_uri}",
            *overrides,
        ],
    )
    return ref, cfg


def test_a_refused_connection_is_tried_every_attempt_and_reported(tmp_path: Path) -> None:
    uri = unused_uri()
    ref, cfg = _published(tmp_path, uri, "artifacts.mlflow.retry_delay_s=0")
    outcome = mirror_published(cfg, ArtifactStore(cfg.artifacts.root).resolve(ref), logger=_LOGGER)
    assert (outcome.mirrored, outcome.attempts) == (False, 3)
    assert outcome.detail.startswith("MlflowException: "), outcome.detail
    assert outcome.line().endswith(
        f"backfill it with: offmeta artifacts mirror robot:1 --to mlflow --root "
        f"{cfg.artifacts.root} --experiment offmeta --registered-model robot --tracking-uri {uri}"
    )


def test_a_server_that_never_answers_costs_the_timeout_and_no_more(
    tmp_path: Path, silent_server: str
) -> None:
    ref, cfg = _published(
        tmp_path, silent_server, "artifacts.mlflow.timeout_s=2", "artifacts.mlflow.retry_delay_s=0"
    )
    outcome = mirror_published(cfg, ArtifactStore(cfg.artifacts.root).resolve(ref), logger=_LOGGER)
    assert (outcome.mirrored, outcome.attempts) == (False, 1)
    assert outcome.detail == "no answer from MLflow within 2 s (artifacts.mlflow.timeout_s)"
    assert outcome.line().startswith(
        "not mirrored to MLflow: robot:1 is published in offmeta, but the mirror failed after "
        "1 attempt (no answer from MLflow within 2 s (artifacts.mlflow.timeout_s)); backfill "
        "it with: offmeta artifacts mirror robot:1 --to mlflow"
    )


def test_the_waits_between_attempts_count_against_the_timeout(tmp_path: Path) -> None:
    ref, cfg = _published(
        tmp_path, unused_uri(), "artifacts.mlflow.timeout_s=1", "artifacts.mlflow.retry_delay_s=5"
    )
    outcome = mirror_published(cfg, ArtifactStore(cfg.artifacts.root).resolve(ref), logger=_LOGGER)
    # A second attempt would start after the 5 s wait, past the 1 s deadline: none is made.
    assert (outcome.mirrored, outcome.attempts) == (False, 1)
