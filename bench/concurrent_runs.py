"""Many ``offmeta run``s at once on this machine: wall time and peak memory of N runs
started together against one Prefect server, one S3 store (moto) and one Ray, against one
run alone with the same servers, measured in the same run of the bench.

Each run is the tiny point-robot config of the flow tests (12 train goals, 12 iterations)
with its own seed, publishing one name to the S3 store, on one single-node Ray of N logical
CPUs (``ray start --head``) that all runs join; the bench
first runs one alone (the baseline), then N together (what ``tests/flows/
test_concurrent_runs.py`` checks, with the same helpers). Memory is the sum of the resident
sets of every process of the runs (pages shared between processes counted once per
process; the shared Ray's processes are not counted, and Ray workers that run their read
jobs are), sampled every half second. Figures:

- ``N-runs-wall``: the N runs' wall time, from the first start to the last end, against
  one run's (N times the baseline is what running them one after another would take);
- ``N-runs-peak-rss``: the highest sum of their resident sets against one run's.

Run: ``.venv/bin/python bench/concurrent_runs.py [--runs N]`` (about 10 minutes for 8 on two
cores).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import Baseline, write_record
from tests.helpers.concurrent_runs import Together, run_together, seeded_configs
from tests.helpers.flow_runs import tiny_point_robot
from tests.helpers.ray_cluster import RayCluster, ray_cluster

DEADLINE_S = 1800


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8, help="runs started together (default 8)")
    args = parser.parse_args()
    # Before Prefect is imported: the test server sends no telemetry (tests/conftest.py).
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    import boto3
    from prefect.testing.utilities import prefect_test_harness

    from pipeline.artifacts import ArtifactStore
    from tests.helpers.s3_server import client_environment, moto_server

    with tempfile.TemporaryDirectory() as scratch_dir, moto_server("serial") as endpoint:
        scratch = Path(scratch_dir)
        os.environ.update(client_environment(endpoint))
        bucket = f"offmeta-bench-{uuid.uuid4().hex[:12]}"
        boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        root = f"s3://{bucket}/store"
        data = tiny_point_robot(scratch / "point_robot")
        with (
            prefect_test_harness(server_startup_timeout=180),
            ray_cluster(scratch / "unused", worker_nodes=0, head_cpus=args.runs) as cluster,
        ):
            alone = _runs(scratch / "alone", data, root, 1, cluster, "alone")
            together = _runs(scratch / "together", data, root, args.runs, cluster, "together")
        versions = ArtifactStore(root).list_versions("together")
    if versions != list(range(1, args.runs + 1)):
        raise SystemExit(f"versions of 'together': {versions}, expected 1-{args.runs}")
    n = args.runs
    print(
        f"{n} runs together: wall {together.wall_s:.1f} s (one alone {alone.wall_s:.1f} s: "
        f"{together.wall_s / alone.wall_s:.2f}x), peak resident sets {together.peak_rss_mb:.0f} "
        f"MB (one alone {alone.peak_rss_mb:.0f} MB: "
        f"{together.peak_rss_mb / alone.peak_rss_mb:.2f}x), largest process "
        f"{together.peak_process_rss_mb:.0f} MB"
    )
    shape = {"runs": n, "config": "tests/helpers/flow_runs.tiny_document", "ray": "one head"}
    details = {
        "peak_process_rss_mb": round(together.peak_process_rss_mb),
        "alone_peak_process_rss_mb": round(alone.peak_process_rss_mb),
        "load_average_1m_at_end": round(os.getloadavg()[0], 1),
    }
    write_record(
        "concurrent_runs",
        f"{n}-runs-wall",
        f"{n} tiny point-robot offmeta runs started together (one Prefect server, one moto S3 "
        "store, one Ray): wall time from the first start to the last end, against "
        "one run alone with the same servers",
        together.wall_s,
        "s",
        baseline=Baseline("one run alone, same config and servers", alone.wall_s),
        shape=shape,
        details=details,
    )
    write_record(
        "concurrent_runs",
        f"{n}-runs-peak-rss",
        f"{n} tiny point-robot offmeta runs started together: the highest sum of the resident "
        "sets of all their processes (not the shared Ray's), sampled every 0.5 s, against one run "
        "alone",
        together.peak_rss_mb,
        "MB",
        baseline=Baseline("one run alone, same config and servers", alone.peak_rss_mb),
        shape=shape,
        details=details,
    )


def _runs(work: Path, data: Path, root: str, runs: int, cluster: RayCluster, name: str) -> Together:
    """``runs`` runs of ``name`` started together in ``work`` on ``cluster``; exits naming a
    failed one."""
    work.mkdir()
    configs = seeded_configs(data, work, root, runs, cluster.address, name)
    done = run_together(work, configs, cluster.environment, deadline_s=DEADLINE_S)
    for config, ended in zip(configs, done.ended, strict=True):
        if ended.returncode != 0:
            raise SystemExit(f"{config} exited {ended.returncode}:\n{ended.output[-3000:]}")
    return done


if __name__ == "__main__":
    main()
