"""``offmeta run`` evaluates in a Gymnasium environment defined outside the package
(``tests.helpers.line_world``, discrete actions, ``info["success"]``): held-out returns and
success rates reach the manifest's metrics, the Prefect report and the rollout picture."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.cli import main
from flows.evaluation.pictures import ROLLOUTS_PX, draw_rollouts
from flows.stages.publishing import prefect_artifact_keys
from pipeline.artifacts import ArtifactStore
from pipeline.synthetic import generate
from tests.helpers.flow_runs import tiny_document, write_config
from tests.helpers.line_world import STEPS, LineWorldTasks
from tests.helpers.published_pictures import png_size

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_session")

POLICIES = ("unadapted", "adapted")


def test_offmeta_run_reports_returns_and_success_in_the_user_s_env(tmp_path: Path) -> None:
    data = tmp_path / "line_world"
    generate(LineWorldTasks(), data, tasks=12, heldout_tasks=4, seed=0)
    work = tmp_path / "work"
    work.mkdir()
    document = tiny_document(
        data,
        work,
        [
            "learners.modules.default_policy.obs_dim=1",
            "learners.modules.default_policy.action_dim=3",
            "learners.modules.default_policy.model.head=categorical",
            "learners.modules.default_policy.loss=cross_entropy",
            "evaluation.env=tests.helpers.line_world:line_env",
            "evaluation.rollout_episodes=3",
            "artifacts.name=line-world",
        ],
    )
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(["run", "--config", str(write_config(work / "run.yaml", document))])
    assert status == 0, stdout.getvalue()
    store = ArtifactStore(work / "artifacts")
    manifest = store.get("line-world:1")
    evaluation = json.loads(store.read_file(manifest, "evaluation.json"))

    metrics = manifest.metrics
    for policy in POLICIES:
        assert metrics[f"heldout_return_{policy}"] == evaluation["returns"][policy]
        assert metrics[f"heldout_success_{policy}"] == evaluation["success"][policy]
        assert 0.0 <= metrics[f"heldout_success_{policy}"] <= 1.0
        final = metrics[f"heldout_success_final_{policy}"]
        assert final == evaluation["success_final"][policy] <= evaluation["success"][policy]
        assert metrics[f"heldout_return_stderr_{policy}"] == evaluation["return_stderr"][policy]
        assert metrics[f"heldout_episode_length_{policy}"] == STEPS
    assert metrics["heldout_return_behavior"] == evaluation["returns"]["behavior"]
    assert "heldout_return_expert" not in metrics  # the line world reports no expert
    assert evaluation["environment"] == "tests.helpers.line_world:line_env"

    lines = stdout.getvalue().strip().splitlines()
    assert lines[0] == (
        "held-out evaluation: 4 tasks, K=5 support / Q=5 query transitions, "
        "context offline: 5 random transitions per task, "
        "3 tests.helpers.line_world:line_env episodes per task"
    )
    measures = [line.split("  ")[0] for line in lines[7:16]]
    assert measures == [
        "return, unadapted",
        "return, adapted (2 steps)",
        "return, behavior data",
        "success rate, unadapted",
        "success rate, adapted (2 steps)",
        "final-step success rate, unadapted",
        "final-step success rate, adapted (2 steps)",
        "episode length, unadapted",
        "episode length, adapted (2 steps)",
    ]
    error = evaluation["return_stderr"]["unadapted"]
    assert lines[7].split()[-1] == f"{error:.2g}"  # "return, unadapted  -9.667 ± 1.2"

    flow_run_id = UUID(manifest.lineage.flow_run_id)
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    table = {a.key: a for a in artifacts}[prefect_artifact_keys("line-world")["table"]].data
    for measure in measures:
        assert measure in table
    assert f"{evaluation['success']['adapted']:.2f}" in table

    rollouts = json.loads(store.read_file(manifest, "rollouts.json"))
    assert [task["task_id"] for task in rollouts["tasks"]] == evaluation["task_ids"]
    for policy in POLICIES:
        per_task = [task["returns"][policy] for task in rollouts["tasks"]]
        assert sum(per_task) / len(per_task) == pytest.approx(evaluation["returns"][policy])
    png = store.read_file(manifest, "rollouts.png")
    assert png_size(png) == ROLLOUTS_PX
    assert draw_rollouts(rollouts) == png
