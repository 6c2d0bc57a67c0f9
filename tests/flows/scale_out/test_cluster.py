"""``offmeta run`` on a Ray cluster whose nodes do not share a disk (``tests.helpers.ray_cluster``:
a head without CPUs and two worker nodes, each with a private tmpfs over ``/tmp`` and the
head's data root), with data and artifacts on moto's S3 server.

The runs are ``offmeta run`` subprocesses joining the cluster with ``--set
ray.address=HOST:PORT``, beside the test session's own local Ray.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from pipeline.artifacts import ArtifactStore
from pipeline.io.dataset_source import filesystem_for
from tests.helpers.flow_runs import tiny_document, tiny_point_robot, write_config
from tests.helpers.paths import REPO
from tests.helpers.ray_cluster import RayCluster, mount_namespaces_refusal, ray_cluster
from tests.helpers.s3_server import OFFMETA

# Hang guards, sized for a busy 2-core machine: both tests took 9 min there at a load average
# of 18 (cluster start, two runs and the stop included).
pytestmark = pytest.mark.timeout(900)

NAME = "tiny-robot"
_RUN_TIMEOUT_S = 600


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


def _offmeta_run(
    cluster: RayCluster, work: Path, data: str, overrides: list[str]
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``offmeta run`` of the tiny config with 2 learners on the cluster; with its seconds."""
    from prefect.settings import PREFECT_API_URL

    document = tiny_document(Path("unused"), work)
    config = write_config(work / "run.yaml", document)
    settings = [
        f"data.train={data}/train",
        f"data.heldout={data}/heldout",
        "learners.num_learners=2",
        "tasks.meta_batch=2",
        f"ray.address={cluster.address}",
        *overrides,
    ]
    argv = [*OFFMETA, "run", "--config", str(config)]
    for setting in settings:
        argv += ["--set", setting]
    env = dict(os.environ, **cluster.environment, PREFECT_API_URL=PREFECT_API_URL.value())
    started = time.monotonic()
    done = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=_RUN_TIMEOUT_S
    )
    return done, time.monotonic() - started


@pytest.mark.usefixtures("prefect_harness")
def test_a_run_trains_on_two_worker_nodes_and_publishes_to_s3(
    cluster: RayCluster, s3_data: str, bucket: str
) -> None:
    store_root = f"{bucket}/store"
    work = cluster.hidden / "s3-run"
    work.mkdir()
    done, _ = _offmeta_run(
        cluster,
        work,
        s3_data,
        [f"training.checkpoint_dir={bucket}/runs", f"artifacts.root={store_root}"],
    )
    assert done.returncode == 0, done.stderr[-4000:]
    manifest = ArtifactStore(store_root).get(f"{NAME}@latest")
    assert manifest.spec == f"{NAME}:1"
    extras = manifest.lineage.extras
    assert extras["num_learners"] == 2
    # Two workers, each on its own worker node: the head has no CPU to give one.
    nodes = extras["worker_nodes"]
    assert len(nodes) == len(set(nodes)) == 2
    assert cluster.head_node_id not in nodes


@pytest.mark.usefixtures("prefect_harness")
def test_a_local_run_dir_is_refused_before_training(
    cluster: RayCluster, s3_data: str, bucket: str
) -> None:
    work = cluster.hidden / "local-run"
    work.mkdir()
    done, seconds = _offmeta_run(
        cluster,
        work,
        s3_data,
        [f"training.checkpoint_dir={work / 'runs'}", f"artifacts.root={bucket}/refused"],
    )
    assert done.returncode == 1
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.startswith("offmeta run: "), done.stderr[-4000:]
    assert last_line.endswith(
        f"the Ray cluster has 3 nodes, but training.checkpoint_dir={str(work / 'runs')!r} is a "
        "local path that the other nodes may not see; set training.checkpoint_dir="
        "s3://BUCKET/PREFIX (and s3:// datasets), or training.shared_filesystem=true if every "
        "node mounts these paths"
    ), done.stderr[-4000:]
    assert seconds < 120  # Prefect, Ray and the data checks start first; no training
