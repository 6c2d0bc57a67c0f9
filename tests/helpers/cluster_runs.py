"""``offmeta run`` on the test cluster (``tests.helpers.ray_cluster``) as a user would start
it, and what its run storage on S3 says while it runs: for tests that kill a node or the
driver once the first checkpoint is in S3."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import boto3

from tests.helpers.flow_runs import tiny_document, write_config
from tests.helpers.offmeta_process import offmeta
from tests.helpers.ray_cluster import RayCluster

ITERATIONS, CHECKPOINT_EVERY = 120, 30
_SNAPSHOT = "ray/train/checkpoint_manager_snapshot.json"
"""Ray Train rewrites it each time it has registered a checkpoint every worker reported."""


class Registered(NamedTuple):
    """A run's newest checkpoint that Ray Train has registered: the one a restart resumes from."""

    run_dir: str
    """``s3://bucket/runs-root/RUN``."""
    iteration: int


def cluster_settings(cluster: RayCluster, data: str, settings: list[str]) -> list[str]:
    """The ``--set`` overrides of a run of the tiny config on the cluster: ``ITERATIONS``, a
    checkpoint every ``CHECKPOINT_EVERY``, no rollouts, 2 learners, the datasets under
    ``data``, then ``settings``."""
    return [
        f"data.train={data}/train",
        f"data.heldout={data}/heldout",
        "learners.num_learners=2",
        "tasks.meta_batch=2",
        f"training.iterations={ITERATIONS}",
        f"training.checkpoint_every={CHECKPOINT_EVERY}",
        f"training.log_every={CHECKPOINT_EVERY}",
        "evaluation.rollout_episodes=0",
        f"ray.address={cluster.address}",
        *settings,
    ]


def offmeta_on_cluster(
    cluster: RayCluster, work: Path, data: str, settings: list[str], *extra: str
) -> subprocess.Popen[str]:
    """``offmeta run`` of the tiny config with ``cluster_settings`` in ``work``; output
    (stdout and stderr) as text, in a process group of its own."""
    config = write_config(work / "run.yaml", tiny_document(Path("unused"), work))
    sets = [
        arg for setting in cluster_settings(cluster, data, settings) for arg in ("--set", setting)
    ]
    return offmeta(work, config, *sets, *extra, environment=cluster.environment)


def keys(runs_root: str) -> list[str]:
    """The keys under ``runs_root`` (``s3://bucket/prefix``), without that prefix, sorted."""
    bucket, _, prefix = runs_root.removeprefix("s3://").partition("/")
    pages = (
        boto3.client("s3")
        .get_paginator("list_objects_v2")
        .paginate(Bucket=bucket, Prefix=f"{prefix}/")
    )
    found = (
        item["Key"].removeprefix(f"{prefix}/")
        for page in pages
        for item in page.get("Contents", ())
    )
    return sorted(key for key in found if key)  # not the folder marker pyarrow puts


def registered_checkpoint(runs_root: str) -> Registered | None:
    """The newest registered checkpoint of the one run under ``runs_root``
    (``s3://bucket/prefix``); None before the first."""
    bucket, _, prefix = runs_root.removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    found = client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/").get("Contents", ())
    for item in found:
        run, _, rest = item["Key"].removeprefix(f"{prefix}/").partition("/")
        if rest == _SNAPSHOT:
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            latest = json.loads(body)["latest_checkpoint_result"]
            if latest is not None:
                return Registered(f"{runs_root}/{run}", latest["metrics"]["iteration"])
    return None


def when_checkpointed(
    process: subprocess.Popen[str], runs_root: str, act: Callable[[], None], timeout: float
) -> Registered:
    """Call ``act`` as soon as the run of ``process`` has a registered checkpoint in
    ``runs_root``; returns the newest registered right after ``act``. Fails if the run ends
    first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(
                f"offmeta run ended before its first checkpoint:\n{process.stdout.read()}"
            )
        if registered_checkpoint(runs_root) is not None:
            act()
            found = registered_checkpoint(runs_root)
            assert found is not None
            return found
        time.sleep(0.25)  # each listing is a request the serial S3 server serves in turn
    raise AssertionError(f"no registered checkpoint under {runs_root} within {timeout:g} s")
