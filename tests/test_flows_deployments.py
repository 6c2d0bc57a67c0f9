"""prefect.yaml: every work-pool deployment names a loadable flow, a config that validates,
parameters the flow accepts, and a valid cron schedule."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from prefect.cli.deploy._models import PrefectYamlModel
from prefect.client.schemas.schedules import CronSchedule
from prefect.flows import load_flow_from_entrypoint

from flows.config import load_config

REPO = Path(__file__).resolve().parents[1]
DOCUMENT = yaml.safe_load((REPO / "prefect.yaml").read_text())


def test_prefect_yaml_is_a_valid_project_file() -> None:
    project = PrefectYamlModel.model_validate(DOCUMENT)
    assert [d.name for d in project.deployments] == ["point-robot-nightly", "sinusoid-weekly"]
    (pull,) = project.pull
    assert pull == {
        "prefect.deployments.steps.set_working_directory": {"directory": "{{ $OFFMETA_HOME }}"}
    }


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
