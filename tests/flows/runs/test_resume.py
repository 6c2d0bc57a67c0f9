"""A run whose ``offmeta run`` process is SIGKILLed mid-training: ``offmeta run --resume``
continues it from its last checkpoint and publishes exactly the parameters and learning
curve of an uninterrupted run of the same config, and Prefect shows the killed flow run
CRASHED instead of RUNNING for good."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from uuid import UUID

import pytest
import torch
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import StateType

from flows.config import validate_config
from flows.meta_train import meta_train
from flows.runs.run_dirs import read_run
from pipeline.artifacts import ArtifactStore
from pipeline.synthetic import SinusoidTasks, generate
from tests.helpers.offmeta_process import offmeta, reap

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("prefect_harness", "ray_session")]

ITERATIONS, CHECKPOINT_EVERY = 1000, 100
PROCESS_TIMEOUT_S = 240


def _document(data: Path, work: Path) -> dict:
    """MAML on 16 sinusoid tasks with a small MLP: a few milliseconds per meta-step, so the
    run is still training when its first checkpoint appears."""
    return {
        "data": {"train": str(data / "train"), "heldout": str(data / "heldout")},
        "tasks": {"support": 5, "query": 5, "meta_batch": 4},
        "learners": {
            "modules": {
                "default_policy": {"obs_dim": 1, "action_dim": 1, "model": {"hidden_sizes": [8]}}
            },
            "inner": {"lr": 0.05},
        },
        "training": {
            "iterations": ITERATIONS,
            "log_every": CHECKPOINT_EVERY,
            "checkpoint_every": CHECKPOINT_EVERY,
            "checkpoint_dir": str(work / "runs"),
        },
        "evaluation": {"tasks": 4, "steps": [0, 1], "rollout_episodes": 0},
        "artifacts": {"root": str(work / "artifacts"), "name": "resumed-sine"},
        "ray": {"num_cpus": 1},
    }


def _kill_when_checkpointed(process: subprocess.Popen, runs: Path, skip: Path) -> Path:
    """SIGKILL ``process`` once a run directory other than ``skip`` holds its first
    checkpoint; returns that run directory."""
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    first = f"checkpoints/ckpt-{CHECKPOINT_EVERY:08d}/learner-0.json"
    while time.monotonic() < deadline:
        found = [path.parent.parent.parent for path in runs.glob(f"*/{first}")]
        found = [path for path in found if path != skip]
        if found:
            process.kill()
            process.wait(timeout=60)
            return found[0]
        if process.poll() is not None:
            pytest.fail(f"offmeta run ended before its first checkpoint:\n{process.stdout.read()}")
        time.sleep(0.02)
    process.kill()
    pytest.fail(f"no {first} under {runs} within {PROCESS_TIMEOUT_S} s:\n{process.stdout.read()}")


@pytest.mark.timeout(2 * PROCESS_TIMEOUT_S + 120)
def test_a_killed_run_resumes_and_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    data, work = tmp_path / "data", tmp_path / "work"
    generate(SinusoidTasks(), data, tasks=16, heldout_tasks=4, seed=0)
    work.mkdir()
    document = _document(data, work)
    config = work / "run.yaml"
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    store = ArtifactStore(work / "artifacts")

    straight = meta_train(validate_config(document))
    assert straight.artifact == "resumed-sine:1"

    killed = offmeta(work, config)
    try:
        run_dir = _kill_when_checkpointed(killed, work / "runs", skip=Path(straight.run_dir))
    finally:
        reap(killed)
    assert killed.returncode == -signal.SIGKILL
    assert read_run(run_dir).finished is None
    killed_flow_run = UUID(run_dir.name)
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(killed_flow_run).state.type == StateType.RUNNING

    resumed = offmeta(work, config, "--resume")
    try:
        output, _ = resumed.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        resumed.kill()
        reap(resumed)
    assert resumed.returncode == 0, output
    match = re.search(rf"^resumed {re.escape(str(run_dir))} at iteration (\d+)$", output, re.M)
    assert match is not None, output
    assert CHECKPOINT_EVERY <= int(match.group(1)) <= ITERATIONS
    # The table is printed once, by the CLI; the log (shown too) says it in one line.
    assert "held-out evaluation on 4 tasks: query loss " in output, output
    assert output.count("query loss, before adaptation") == 1, output
    assert output.splitlines()[-1].startswith("published resumed-sine:2: file://")

    assert read_run(run_dir).finished["artifact"] == "resumed-sine:2"
    manifest = store.get("resumed-sine:2")
    assert manifest.lineage.extras["resumed_from_iteration"] == int(match.group(1))
    assert manifest.lineage.weights_seq_no == ITERATIONS
    expected = store.load_params(straight.artifact)["default_policy"]
    found = store.load_params("resumed-sine:2")["default_policy"]
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name
    assert store.read_file("resumed-sine:2", "history.json") == store.read_file(
        straight.artifact, "history.json"
    )

    with get_client(sync_client=True) as client:
        crashed = client.read_flow_run(killed_flow_run).state
        finished = client.read_flow_run(UUID(manifest.lineage.flow_run_id)).state
    assert crashed.type == StateType.CRASHED
    assert crashed.message == (
        f"its process ended without finishing the run (killed?): the run directory {run_dir} "
        "is unfinished and no process holds it; continue it with offmeta run --resume"
    )
    assert finished.type == StateType.COMPLETED
