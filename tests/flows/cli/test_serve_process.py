"""``offmeta serve`` on a cron schedule, in a process of its own: the deployment is
registered with its cron, a triggered run completes, and the serving process, idle again,
ends on SIGTERM with 143 (tests/flows/test_serve_signals.py stops a run in progress)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.responses import DeploymentResponse

from tests.helpers.flow_runs import tiny_document, tiny_point_robot, write_config
from tests.helpers.paths import REPO

pytestmark = pytest.mark.system

SERVE_TIMEOUT_S = 240


@pytest.mark.usefixtures("prefect_harness")
def test_serve_registers_the_cron_deployment_runs_it_and_stops_cleanly(tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    from pipeline.artifacts import ArtifactStore

    data = tiny_point_robot(tmp_path / "point_robot")
    document = tiny_document(
        data,
        tmp_path,
        ["artifacts.name=served-robot", "ray.num_cpus=1", "evaluation.rollout_episodes=0"],
    )
    config = write_config(tmp_path / "serve.yaml", document)
    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PREFECT_RUNNER_POLL_FREQUENCY": "1",
    }
    offmeta = Path(sys.executable).with_name("offmeta")
    command = [str(offmeta), "serve", "--config", str(config)]
    command += ["--cron", "0 3 * * *", "--name", "nightly"]
    log = tmp_path / "serve.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=output)
    try:
        with get_client(sync_client=True) as client:
            deployment = _wait_for_deployment(client, "meta-train/nightly", server, log)
        assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
        assert deployment.parameters["cfg"]["artifacts"]["name"] == "served-robot"

        flow_run = run_deployment(deployment.id, timeout=SERVE_TIMEOUT_S, poll_interval=1)
        assert flow_run.state.is_completed(), log.read_text()[-3000:]
        manifest = ArtifactStore(tmp_path / "artifacts").get("served-robot@latest")
        assert manifest.lineage.flow_run_id == str(flow_run.id)

        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 143, log.read_text()[-3000:]
        stopped = (
            "offmeta serve: interrupted by SIGTERM: no run was in progress; no longer serving "
            "meta-train/nightly"
        )
        assert log.read_text().splitlines()[-1] == stopped
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


def _wait_for_deployment(
    client: SyncPrefectClient, name: str, server: subprocess.Popen, log: Path
) -> DeploymentResponse:
    from prefect.exceptions import ObjectNotFound

    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"offmeta serve exited with {server.returncode}:\n{log.read_text()}")
        try:
            return client.read_deployment_by_name(name)
        except ObjectNotFound:
            time.sleep(0.5)
    pytest.fail(f"deployment {name} was not registered within 90 s:\n{log.read_text()}")
