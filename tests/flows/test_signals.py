"""SIGTERM or SIGINT ends ``offmeta run`` within seconds at every stage: before the flow,
training, evaluation, publishing and the MLflow mirror. The signal goes to the run's whole
process group, as a Ctrl-C's or ``timeout``'s does. The run exits 143 (SIGTERM) or 130
(SIGINT) with one line naming the stage and how to go on, its flow run is CRASHED on the
Prefect server it used (the temporary one included), its run directory resumes with
``--resume``, and nothing partial is published.

Each stage is reached by watching the run's output for a line only that stage prints: a
dataset warning before the flow, a progress line in training, an evaluation environment that
stalls at its first step, an S3 endpoint and an MLflow server that accept connections and never
answer (``tests.helpers.silent_server``)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client

from pipeline.artifacts import ArtifactStore
from tests.helpers.flow_runs import tiny_document, tiny_point_robot, write_config
from tests.helpers.offmeta_process import offmeta, reap
from tests.helpers.silent_server import silent_server
from tests.helpers.stalling_env import STALLING_LINE

pytestmark = [
    pytest.mark.system,
    pytest.mark.usefixtures("prefect_harness"),
    pytest.mark.timeout(900),
]

ENDS_WITHIN_S = 10
"""Seconds from the signal to the end of the process (issue 34)."""
REACHES_STAGE_S = 300
"""Seconds a run may take to reach the stage a test stops it in (Ray and Prefect start first)."""


@dataclass
class Stopped:
    status: int
    output: str
    """Everything the run printed, up to its end."""

    @property
    def last(self) -> str:
        return self.output.splitlines()[-1]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_point_robot(tmp_path_factory.mktemp("point_robot"))


def _config(work: Path, data: Path, *overrides: str) -> Path:
    settings = ["training.iterations=40", "training.checkpoint_every=4", "training.log_every=4"]
    return write_config(work / "run.yaml", tiny_document(data, work, [*settings, *overrides]))


def _stop_at(
    process: subprocess.Popen, line: str | re.Pattern[str], signum: int = signal.SIGTERM
) -> Stopped:
    """Wait for ``line`` in the run's output, send ``signum`` to its process group, and
    return how it ended, which must be within ``ENDS_WITHIN_S``."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for text in process.stdout:
            lines.put(text.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    pattern = re.compile(re.escape(line)) if isinstance(line, str) else line
    try:
        while True:
            text = lines.get(timeout=REACHES_STAGE_S)
            assert text is not None, "the run ended before the stage:\n" + "\n".join(seen)
            seen.append(text)
            if pattern.search(text):
                break
        os.killpg(process.pid, signum)
        status = process.wait(timeout=ENDS_WITHIN_S)
        while (text := lines.get(timeout=ENDS_WITHIN_S)) is not None:
            seen.append(text)
        return Stopped(status, "\n".join(seen))
    finally:
        reap(process)


def _flow_run_state(run_dir: Path) -> str:
    with get_client(sync_client=True) as client:
        found = client.read_flow_run(UUID(run_dir.name))
    return found.state.type.value


def _only_run_dir(work: Path) -> Path:
    (run_dir,) = (work / "runs").iterdir()
    return run_dir


def _again(work: Path) -> str:
    return f"offmeta run --config {work / 'run.yaml'}"


def _resume_line(signame: str, stage: str, work: Path, run_dir: Path) -> str:
    return (
        f"offmeta run: interrupted by {signame} {stage}: the run directory {run_dir} keeps its "
        f"last checkpoint; continue it with: {_again(work)} --resume {run_dir}"
    )


def test_sigint_in_training_crashes_the_flow_run_and_resume_finishes_it(
    data: Path, tmp_path: Path
) -> None:
    config = _config(tmp_path, data)
    stopped = _stop_at(offmeta(tmp_path, config), re.compile(r"iteration 8/40 "), signal.SIGINT)
    assert stopped.status == 130, stopped.output
    run_dir = _only_run_dir(tmp_path)
    assert stopped.last == _resume_line("SIGINT", "during training", tmp_path, run_dir)
    assert _flow_run_state(run_dir) == "CRASHED"
    store = ArtifactStore(tmp_path / "artifacts")
    assert store.list_versions("tiny-robot") == []

    finished = offmeta(tmp_path, config, "--resume", str(run_dir))
    output, _ = finished.communicate(timeout=REACHES_STAGE_S)
    assert finished.returncode == 0, output
    resumed = re.search(rf"^resumed {re.escape(str(run_dir))} at iteration (\d+)$", output, re.M)
    assert resumed is not None and int(resumed.group(1)) >= 4, output
    assert store.list_versions("tiny-robot") == [1]


def test_sigterm_before_the_flow_ends_the_run_with_nothing_made(data: Path, tmp_path: Path) -> None:
    # Actions outside a declared box are a warning of the checks before Ray and the flow.
    narrow = tmp_path / "narrow"
    shutil.copytree(data, narrow)
    described = json.loads((narrow / "train" / "dataset.json").read_text())
    described["action_space"]["high"] = 0.01
    (narrow / "train" / "dataset.json").write_text(json.dumps(described))
    config = _config(tmp_path, narrow)
    stopped = _stop_at(offmeta(tmp_path, config), "offmeta run: warning: ")
    assert stopped.status == 143, stopped.output
    assert stopped.last == (
        "offmeta run: interrupted by SIGTERM before the flow started: no run directory was "
        f"made; start it again with: {_again(tmp_path)}"
    )
    assert not (tmp_path / "runs").exists()


def test_sigterm_in_evaluation_publishes_nothing(data: Path, tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        data,
        "training.iterations=8",
        "evaluation.env=tests.helpers.stalling_env:stalling_point_robot",
    )
    stopped = _stop_at(offmeta(tmp_path, config), STALLING_LINE)
    assert stopped.status == 143, stopped.output
    run_dir = _only_run_dir(tmp_path)
    assert stopped.last == _resume_line("SIGTERM", "during evaluation", tmp_path, run_dir)
    assert _flow_run_state(run_dir) == "CRASHED"
    assert ArtifactStore(tmp_path / "artifacts").list_versions("tiny-robot") == []


def test_sigterm_while_publishing_to_a_silent_store(data: Path, tmp_path: Path) -> None:
    with silent_server() as endpoint:
        config = _config(
            tmp_path, data, "training.iterations=8", "artifacts.root=s3://models/offmeta"
        )
        s3 = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_REGION": "us-east-1",
        }
        process = offmeta(tmp_path, config, environment=s3)
        stopped = _stop_at(
            process, "publishing the next version of tiny-robot to s3://models/offmeta"
        )
    assert stopped.status == 143, stopped.output
    run_dir = _only_run_dir(tmp_path)
    assert stopped.last == _resume_line("SIGTERM", "while publishing", tmp_path, run_dir)
    assert _flow_run_state(run_dir) == "CRASHED"


def test_sigterm_during_the_mirror_leaves_the_version_published(data: Path, tmp_path: Path) -> None:
    with silent_server() as mlflow:
        config = _config(
            tmp_path,
            data,
            "training.iterations=8",
            f"artifacts.mlflow.tracking_uri={mlflow}",
            "artifacts.mlflow.timeout_s=300",
        )
        stopped = _stop_at(offmeta(tmp_path, config), "mirroring tiny-robot:1 to MLflow at ")
    assert stopped.status == 143, stopped.output
    root = tmp_path / "artifacts"
    assert stopped.last == (
        "offmeta run: interrupted by SIGTERM during the MLflow mirror: tiny-robot:1 is "
        f"published; mirror it with: offmeta artifacts mirror tiny-robot:1 --to mlflow --root "
        f"{root} --experiment offmeta --registered-model tiny-robot --tracking-uri {mlflow}"
    )
    store = ArtifactStore(root)
    assert store.list_versions("tiny-robot") == [1]
    store.verify("tiny-robot:1")
    assert _flow_run_state(_only_run_dir(tmp_path)) == "CRASHED"


def test_the_temporary_prefect_server_records_the_crash_before_it_stops(
    data: Path, tmp_path: Path
) -> None:
    home = tmp_path / "prefect-home"
    home.mkdir()
    config = _config(tmp_path, data)
    process = offmeta(
        tmp_path, config, environment={"PREFECT_HOME": str(home)}, temporary_prefect=True
    )
    stopped = _stop_at(process, re.compile(r"iteration 8/40 "))
    assert stopped.status == 143, stopped.output
    assert "Error logging to API" not in stopped.output
    run_dir = _only_run_dir(tmp_path)
    assert stopped.last == _resume_line("SIGTERM", "during training", tmp_path, run_dir)
    # The temporary server is gone with the run; its database holds what it recorded.
    with contextlib.closing(sqlite3.connect(home / "prefect.db")) as database:
        states = database.execute("SELECT state_type FROM flow_run").fetchall()
    assert states == [("CRASHED",)]
