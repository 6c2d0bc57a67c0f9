"""prefect.yaml: every work-pool deployment names a loadable flow, a config that validates,
parameters the flow accepts, and a valid cron schedule; ``prefect deploy --all`` stores
deployments whose runs start in the checkout, with no environment variable to set."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prefect.cli.deploy._models import PrefectYamlModel
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint

from flows.config import load_config
from tests.helpers.paths import REPO

REPO = REPO
DOCUMENT = yaml.safe_load((REPO / "prefect.yaml").read_text())


def test_prefect_yaml_is_a_valid_project_file() -> None:
    project = PrefectYamlModel.model_validate(DOCUMENT)
    assert [d.name for d in project.deployments] == ["point-robot-nightly", "sinusoid-weekly"]
    assert project.build == [
        {"prefect.deployments.steps.set_working_directory": {"id": "checkout", "directory": "."}}
    ]
    assert project.pull == [
        {
            "prefect.deployments.steps.set_working_directory": {
                "directory": "{{ checkout.directory }}"
            }
        }
    ]


@pytest.mark.parametrize("deployment", DOCUMENT["deployments"], ids=lambda d: d["name"])
def test_each_deployment_runs_a_checked_in_config(
    deployment: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    flow = load_flow_from_entrypoint(deployment["entrypoint"])
    assert flow.name == "meta-train-from-file"
    parameters = flow.validate_parameters(deployment["parameters"])
    cfg = load_config(parameters["config"], parameters["overrides"])
    assert cfg.learners.num_learners == 0
    (schedule,) = deployment["schedules"]
    assert CronSchedule(cron=schedule["cron"], timezone=schedule["timezone"]).cron
    assert deployment["work_pool"]["name"] == "offmeta"


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("prefect_harness")
def test_deployments_run_in_the_checkout_without_any_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.deployments.steps.core import run_steps
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.settings import PREFECT_API_URL

    # contextlib.suppress: another test of the session may have made the pool.
    with get_client(sync_client=True) as client, contextlib.suppress(ObjectAlreadyExists):
        client.create_work_pool(WorkPoolCreate(name="offmeta", type="process"))
    env = {name: value for name, value in os.environ.items() if name != "OFFMETA_HOME"}
    env["PREFECT_API_URL"] = PREFECT_API_URL.value()
    prefect = str(Path(sys.executable).with_name("prefect"))
    done = subprocess.run(
        [prefect, "--no-prompt", "deploy", "--all"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=480,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    monkeypatch.delenv("OFFMETA_HOME", raising=False)
    for spec in DOCUMENT["deployments"]:
        with get_client(sync_client=True) as client:
            stored = client.read_deployment_by_name(f"meta-train-from-file/{spec['name']}")
        assert stored.pull_steps == [
            {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
        ]
        # What a worker does for a run, from a directory of its own.
        monkeypatch.chdir(tmp_path)
        asyncio.run(run_steps(stored.pull_steps))
        assert Path.cwd() == REPO
        flow = load_flow_from_entrypoint(stored.entrypoint)
        parameters = flow.validate_parameters(stored.parameters)
        assert load_config(parameters["config"], parameters["overrides"]).artifacts.name
