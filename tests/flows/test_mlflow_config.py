"""``artifacts.mlflow``: off by default, the registered model defaults to the artifact name, and
bad values are refused with their field path."""

from __future__ import annotations

import pytest

from flows.config import ConfigError, MlflowConfig, load_config
from tests.helpers.paths import REPO

POINT_ROBOT = REPO / "flows" / "configs" / "point_robot.yaml"


def test_the_mirror_is_off_unless_configured() -> None:
    cfg = load_config(POINT_ROBOT)
    assert cfg.artifacts.mlflow is None
    assert cfg.artifacts.registered_model is None


def test_an_mlflow_section_defaults_to_the_environment_uri_and_the_artifact_name() -> None:
    cfg = load_config(POINT_ROBOT, ["artifacts.mlflow={}", "artifacts.name=nightly"])
    assert cfg.artifacts.mlflow == MlflowConfig(
        tracking_uri=None, experiment="offmeta", registered_model=None, attempts=3
    )
    assert cfg.artifacts.registered_model == "nightly"
    named = load_config(POINT_ROBOT, ["artifacts.mlflow.registered_model=robots"])
    assert named.artifacts.registered_model == "robots"


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "artifacts.mlflow.attempts=0",
            "artifacts.mlflow.attempts: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            "artifacts.mlflow.timeout_s=0",
            "artifacts.mlflow.timeout_s: Input should be greater than 0 (got 0)",
        ),
        (
            "artifacts.mlflow.experiment=''",
            "artifacts.mlflow.experiment: String should have at least 1 character (got '')",
        ),
    ],
)
def test_bad_mirror_settings_are_refused(override: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(POINT_ROBOT, [override])
    assert str(caught.value) == f"invalid config {POINT_ROBOT} (1 error):\n  {line}"
