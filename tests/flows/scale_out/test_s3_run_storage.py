"""A Ray Train run whose run storage is S3 (``training.checkpoint_dir: s3://...``): it
writes run.json, its checkpoints and its finished marker to the bucket and publishes; a
driver SIGKILLed mid-run leaves its lock behind, which refuses nobody once its process is
gone, while the lock of a live driver refuses a second one; ``offmeta run --resume
s3://.../RUN`` continues the killed run and ends with the parameters of an uninterrupted
run."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import boto3
import pytest
import torch
import yaml

from flows.config import validate_config
from flows.meta_train import meta_train
from flows.runs.run_dirs import RunDirError, check_resumable, read_run
from pipeline.artifacts import ArtifactStore
from pipeline.synthetic import SinusoidTasks, generate
from tests.helpers.offmeta_process import offmeta, reap

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_session")

ITERATIONS, CHECKPOINT_EVERY = 600, 100
PROCESS_TIMEOUT_S = 480
_CHECKPOINT = re.compile(r"runs/([^/]+)/ray/train/checkpoint_[^/]+/learner-0\.json")


def _document(data: Path, bucket: str) -> dict:
    """MAML on 16 sinusoid tasks with a small MLP on one Ray Train worker."""
    return {
        "data": {"train": str(data / "train"), "heldout": str(data / "heldout")},
        "tasks": {"support": 5, "query": 5, "meta_batch": 4},
        "learners": {
            "num_learners": 1,
            "modules": {
                "default_policy": {"obs_dim": 1, "action_dim": 1, "model": {"hidden_sizes": [8]}}
            },
            "inner": {"lr": 0.05},
        },
        "training": {
            "iterations": ITERATIONS,
            "log_every": CHECKPOINT_EVERY,
            "checkpoint_every": CHECKPOINT_EVERY,
            "checkpoint_dir": f"s3://{bucket}/runs",
            "retries": 0,
        },
        "evaluation": {"tasks": 4, "steps": [0, 1], "rollout_episodes": 0},
        "artifacts": {"root": f"s3://{bucket}/store", "name": "s3-sine"},
        "ray": {"num_cpus": 2},
    }


def _keys(bucket: str, prefix: str) -> list[str]:
    pages = (
        boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    )
    return sorted(item["Key"] for page in pages for item in page.get("Contents", ()))


def _kill_when_checkpointed(process: subprocess.Popen, bucket: str, skip: str) -> str:
    """SIGKILL ``process`` once a run other than ``skip`` has a checkpoint in the bucket;
    returns that run's id."""
    deadline = time.monotonic() + PROCESS_TIMEOUT_S
    while time.monotonic() < deadline:
        found = {m.group(1) for key in _keys(bucket, "runs/") if (m := _CHECKPOINT.fullmatch(key))}
        found.discard(skip)
        if found:
            process.kill()
            process.wait(timeout=60)
            return found.pop()
        if process.poll() is not None:
            pytest.fail(f"offmeta run ended before its first checkpoint:\n{process.stdout.read()}")
        time.sleep(1.0)  # each listing is a request the serial S3 server serves in turn
    process.kill()
    pytest.fail(f"no checkpoint within {PROCESS_TIMEOUT_S} s:\n{process.stdout.read()}")


@pytest.mark.timeout(3 * PROCESS_TIMEOUT_S + 120)
def test_a_run_on_s3_storage_completes_and_a_killed_one_resumes_equal(
    s3_root: str, tmp_path: Path
) -> None:
    bucket = s3_root.removeprefix("s3://").split("/")[0]
    data, work = tmp_path / "data", tmp_path / "work"
    generate(SinusoidTasks(), data, tasks=16, heldout_tasks=4, seed=0)
    work.mkdir()
    document = _document(data, bucket)
    config = work / "run.yaml"
    config.write_text(yaml.safe_dump(document, sort_keys=False))
    store = ArtifactStore(f"s3://{bucket}/store")

    straight = meta_train(validate_config(document))
    assert straight.artifact == "s3-sine:1"
    assert straight.run_dir.startswith(f"s3://{bucket}/runs/")
    straight_id = straight.run_dir.rsplit("/", 1)[1]
    written = [key.removeprefix(f"runs/{straight_id}/") for key in _keys(bucket, "runs/")]
    assert {"run.json", "finished.json"} <= set(written)
    assert "run.lock" not in written
    assert any(
        re.fullmatch(r"ray/train/checkpoint_[^/]+/learner-0\.safetensors", k) for k in written
    )
    assert any(k.startswith("ray/train/offmeta-attempts/attempt-0000") for k in written)
    assert not (work / "runs").exists() and not (work / "s3:").exists()
    lineage = store.get(straight.artifact).lineage
    assert lineage.extras["checkpoint"].startswith(f"s3://{bucket}/runs/{straight_id}/ray/train/")

    killed = offmeta(work, config)
    try:
        run_id = _kill_when_checkpointed(killed, bucket, skip=straight_id)
    finally:
        reap(killed)
    assert killed.returncode == -signal.SIGKILL
    run_dir = f"s3://{bucket}/runs/{run_id}"
    assert read_run(run_dir).finished is None
    assert f"runs/{run_id}/run.lock" in _keys(bucket, f"runs/{run_id}/")
    check_resumable(read_run(run_dir), validate_config(document))  # its holder is gone

    resumed = offmeta(work, config, "--resume", run_dir)
    try:
        # While it runs, its lock refuses a second driver on the same run.
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while True:
            try:
                check_resumable(read_run(run_dir), validate_config(document))
            except RunDirError as error:
                assert str(error) == (
                    f"{run_dir}: it is running: process {resumed.pid} on "
                    f"{socket.gethostname()} holds its run.lock; wait for that "
                    "run to end or stop it first"
                )
                break
            assert time.monotonic() < deadline and resumed.poll() is None, "never held"
            time.sleep(0.1)
        output, _ = resumed.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        resumed.kill()
        reap(resumed)
    assert resumed.returncode == 0, output
    match = re.search(rf"^resumed {re.escape(run_dir)} at iteration (\d+)$", output, re.M)
    assert match is not None, output
    assert CHECKPOINT_EVERY <= int(match.group(1)) <= ITERATIONS
    assert output.splitlines()[-1].startswith(f"published s3-sine:2: s3://{bucket}/store/")

    assert read_run(run_dir).finished["artifact"] == "s3-sine:2"
    assert f"runs/{run_id}/run.lock" not in _keys(bucket, f"runs/{run_id}/")
    expected = store.load_params(straight.artifact)["default_policy"]
    found = store.load_params("s3-sine:2")["default_policy"]
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name
    assert store.read_file("s3-sine:2", "history.json") == store.read_file(
        straight.artifact, "history.json"
    )
