"""``offmeta run`` on a Ray cluster whose nodes do not share a disk (``tests.helpers.ray_cluster``:
a head without CPUs and two worker nodes, each with a private tmpfs over ``/tmp`` and the
head's data root), with data, run storage (``training.checkpoint_dir: s3://...``) and
artifacts on moto's S3 server: run.json, the checkpoints, the restart count and the finished
marker go to the bucket; a driver SIGKILLed mid-run leaves its lock behind, which refuses
nobody once its process is gone, while the lock of a live driver refuses a second one.

The runs are ``offmeta run`` subprocesses joining the cluster with ``--set
ray.address=HOST:PORT``, beside the test session's own local Ray. One uninterrupted run is
the reference the runs that lose their driver or a node must end equal to. The node-kill
test comes last: the cluster has one worker node left after it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple
from uuid import UUID

import pyarrow.fs as pafs
import pytest
import torch

from flows.config import MetaTrainConfig
from flows.runs.run_dirs import RunDirError, check_resumable, read_run
from pipeline.artifacts import ArtifactStore
from pipeline.io.dataset_source import filesystem_for
from tests.helpers.cluster_runs import (
    CHECKPOINT_EVERY,
    ITERATIONS,
    cluster_settings,
    keys,
    offmeta_on_cluster,
    when_checkpointed,
)
from tests.helpers.flow_runs import tiny_config, tiny_point_robot
from tests.helpers.offmeta_process import reap
from tests.helpers.ray_cluster import RayCluster, mount_namespaces_refusal, ray_cluster

# Hang guards, sized for a busy 2-core machine: at load averages of 10 to 28 the longest
# test took 273 s there, the module 10 to 15 min (docs/cluster-tests.md).
pytestmark = [
    pytest.mark.system,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("prefect_harness"),
]

NAME = "tiny-robot"
_RUN_TIMEOUT_S = 600

_PREFECT_LOG = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} \| [A-Z]+ +\| ")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str) -> Iterator[RayCluster]:
    """The cluster, started after the S3 server so that its nodes see the AWS variables."""
    refusal = mount_namespaces_refusal()
    if refusal is not None:
        pytest.skip(f"a cluster of nodes in their own mount namespaces: {refusal}")
    with ray_cluster(tmp_path_factory.mktemp("cluster")) as running:
        yield running


@pytest.fixture(scope="module")
def bucket(s3_endpoint: str) -> str:
    import boto3

    name = f"offmeta-cluster-{uuid.uuid4().hex[:12]}"
    boto3.session.Session().client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def s3_data(cluster: RayCluster, bucket: str) -> str:
    """The tiny point-robot datasets, written on the head and copied to S3."""
    local = tiny_point_robot(cluster.hidden / "data")
    filesystem, path = filesystem_for(f"{bucket}/data")
    pafs.copy_files(str(local), path, destination_filesystem=filesystem)
    return f"{bucket}/data"


class Finished(NamedTuple):
    returncode: int
    output: str
    seconds: float


def _finish(process: subprocess.Popen[str]) -> Finished:
    started = time.monotonic()
    try:
        output, _ = process.communicate(timeout=_RUN_TIMEOUT_S)
    finally:
        process.kill()
        reap(process)
    return Finished(process.returncode, output, time.monotonic() - started)


def _work(cluster: RayCluster, name: str) -> Path:
    work = cluster.hidden / name
    work.mkdir()
    return work


def _storage(bucket: str, name: str) -> list[str]:
    return [
        f"training.checkpoint_dir={bucket}/runs-{name}",
        f"artifacts.root={bucket}/store-{name}",
    ]


@pytest.fixture(scope="module")
def straight(cluster: RayCluster, s3_data: str, bucket: str) -> ArtifactStore:
    """The uninterrupted run (2 learners, run storage and artifacts on S3); its store."""
    work = _work(cluster, "straight")
    done = _finish(offmeta_on_cluster(cluster, work, s3_data, _storage(bucket, "straight")))
    assert done.returncode == 0, done.output[-4000:]
    assert not (work / "runs").exists() and not (work / "s3:").exists()  # nothing local
    return ArtifactStore(f"{bucket}/store-straight")


def _until_held(process: subprocess.Popen[str], run_dir: str, cfg: MetaTrainConfig) -> None:
    """Check that the run at ``run_dir`` can be resumed until it cannot (``RunDirError``):
    ``process`` holds it."""
    deadline = time.monotonic() + _RUN_TIMEOUT_S
    while time.monotonic() < deadline and process.poll() is None:
        check_resumable(read_run(run_dir), cfg)
        time.sleep(0.1)
    raise AssertionError(f"{run_dir} was never held by process {process.pid}")


def _assert_ends_equal(store: ArtifactStore, reference: ArtifactStore) -> None:
    """The version ``store`` published has the parameters and learning curve of the
    reference run's, bit for bit (same seed and data; the two workers' sum of two
    gradients is the same in any order)."""
    expected = reference.load_params(f"{NAME}:1")["default_policy"]
    found = store.load_params(f"{NAME}:1")["default_policy"]
    assert found.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(found[name], tensor), name
    history = store.read_file(f"{NAME}:1", "history.json")
    assert history == reference.read_file(f"{NAME}:1", "history.json")


def test_a_local_run_dir_is_refused_before_training(
    cluster: RayCluster, s3_data: str, bucket: str
) -> None:
    work = _work(cluster, "local-run")
    settings = [f"training.checkpoint_dir={work / 'runs'}", f"artifacts.root={bucket}/refused"]
    done = _finish(offmeta_on_cluster(cluster, work, s3_data, settings))
    assert done.returncode == 1
    # Prefect's event worker may log once more while the process exits ("Still processing
    # items"): the refusal is offmeta's last line of its own.
    own = [line for line in done.output.strip().splitlines() if not _PREFECT_LOG.match(line)]
    last_line = own[-1]
    assert last_line.startswith("offmeta run: "), done.output[-4000:]
    assert last_line.endswith(
        f"the Ray cluster has 3 nodes, but training.checkpoint_dir={str(work / 'runs')!r} is a "
        "local path that the other nodes may not see; set training.checkpoint_dir="
        "s3://BUCKET/PREFIX (and s3:// datasets), or training.shared_filesystem=true if every "
        "node mounts these paths"
    ), done.output[-4000:]
    assert done.seconds < 120  # Prefect, Ray and the data checks start first; no training


def test_a_run_trains_on_two_worker_nodes_and_publishes_to_s3(
    cluster: RayCluster, bucket: str, straight: ArtifactStore
) -> None:
    manifest = straight.get(f"{NAME}@latest")
    assert manifest.spec == f"{NAME}:1"
    (run,) = {key.split("/")[0] for key in keys(f"{bucket}/runs-straight")}
    written = [key.removeprefix(f"{run}/") for key in keys(f"{bucket}/runs-straight")]
    assert {"run.json", "finished.json"} <= set(written)
    assert "run.lock" not in written
    assert "ray/train/offmeta-attempts/attempt-0000" in written
    for rank in (0, 1):
        shard = rf"ray/train/checkpoint_[^/]+/learner-{rank}\.safetensors"
        assert any(re.fullmatch(shard, key) for key in written), written
    extras = manifest.lineage.extras
    assert extras["checkpoint"].startswith(f"{bucket}/runs-straight/{run}/ray/train/checkpoint_")
    assert (extras["num_learners"], extras["restarts"]) == (2, 0)
    # Two workers, each on its own worker node: the head has no CPU to give one.
    nodes = extras["worker_nodes"]
    assert len(nodes) == len(set(nodes)) == 2
    assert cluster.head_node_id not in nodes


def test_a_killed_driver_resumes_from_s3_and_ends_equal(
    cluster: RayCluster, s3_data: str, bucket: str, straight: ArtifactStore
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.objects import StateType

    work, storage = _work(cluster, "driver-kill"), _storage(bucket, "driver-kill")
    driver = offmeta_on_cluster(cluster, work, s3_data, storage)
    try:
        killed = when_checkpointed(driver, f"{bucket}/runs-driver-kill", driver.kill, 300)
        driver.wait(timeout=60)
    finally:
        reap(driver)
    assert driver.returncode == -signal.SIGKILL
    record = read_run(killed.run_dir)
    assert record.finished is None
    (killed_flow_run,) = record.flow_run_ids()
    run_keys = f"{bucket}/runs-driver-kill"
    assert f"{killed.run_dir.rsplit('/', 1)[1]}/run.lock" in keys(run_keys)
    cfg = tiny_config(Path("unused"), work, cluster_settings(cluster, s3_data, storage))
    check_resumable(record, cfg)  # its holder is gone

    resumed = offmeta_on_cluster(cluster, work, s3_data, storage, "--resume", killed.run_dir)
    try:
        # While it runs, its lock refuses a second driver on the same run.
        with pytest.raises(RunDirError) as refused:
            _until_held(resumed, killed.run_dir, cfg)
        assert str(refused.value) == (
            f"{killed.run_dir}: it is running: process {resumed.pid} on {socket.gethostname()} "
            "holds its run.lock; wait for that run to end or stop it first"
        )
    finally:
        done = _finish(resumed)
    assert done.returncode == 0, done.output[-4000:]
    match = re.search(
        rf"^resumed {re.escape(killed.run_dir)} at iteration (\d+)$", done.output, re.M
    )
    assert match is not None, done.output[-4000:]
    assert killed.iteration <= int(match.group(1)) < ITERATIONS
    assert done.output.splitlines()[-1].startswith(
        f"published {NAME}:1: {bucket}/store-driver-kill/"
    ), done.output[-4000:]
    assert read_run(killed.run_dir).finished["artifact"] == f"{NAME}:1"
    assert f"{killed.run_dir.rsplit('/', 1)[1]}/run.lock" not in keys(run_keys)
    store = ArtifactStore(f"{bucket}/store-driver-kill")
    assert store.get(f"{NAME}:1").lineage.extras["resumed_from_iteration"] == int(match.group(1))
    _assert_ends_equal(store, straight)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(UUID(killed_flow_run)).state
    assert state.type == StateType.CRASHED
    assert state.message == (
        f"its process ended without finishing the run (killed?): the run directory "
        f"{killed.run_dir} is unfinished and no process holds it; continue it with offmeta run "
        "--resume"
    )


def test_a_killed_worker_node_is_survived(
    cluster: RayCluster, s3_data: str, bucket: str, straight: ArtifactStore
) -> None:
    # Two workers of 0.25 CPU (2 CPUs less 1.5 kept for reads, shared by two), one on each
    # worker node, so that both fit on the node that survives, beside its reads.
    settings = [
        *_storage(bucket, "node-kill"),
        "ray.reserved_read_cpus=1.5",
        "ray.placement_strategy=SPREAD",
    ]
    run = offmeta_on_cluster(cluster, _work(cluster, "node-kill"), s3_data, settings)
    lost = cluster.worker_nodes[0]

    def kill_node() -> None:
        os.kill(lost.raylet_pid(), signal.SIGKILL)

    try:
        at_kill = when_checkpointed(run, f"{bucket}/runs-node-kill", kill_node, 300)
    except BaseException:
        run.kill()
        reap(run)
        raise
    done = _finish(run)
    assert done.returncode == 0, done.output[-4000:]
    store = ArtifactStore(f"{bucket}/store-node-kill")
    extras = store.get(f"{NAME}:1").lineage.extras
    assert extras["restarts"] == 1
    # The newest checkpoint registered when the node died; one more may have been reported
    # by every worker just before and registered just after.
    assert extras["resumed_from_iteration"] in (
        at_kill.iteration,
        at_kill.iteration + CHECKPOINT_EVERY,
    )
    assert extras["checkpoint"].startswith(f"{at_kill.run_dir}/ray/train/checkpoint_")
    # Both workers of the last attempt ran on the node that was left.
    assert len(extras["worker_nodes"]) == 1
    assert cluster.head_node_id not in extras["worker_nodes"]
    _assert_ends_equal(store, straight)
    assert read_run(at_kill.run_dir).finished["artifact"] == f"{NAME}:1"
