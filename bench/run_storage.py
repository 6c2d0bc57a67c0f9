"""S3 requests of a Ray Train run whose dataset and run storage are in S3, counted by what
they are for: the dataset read, the run records (run.json, run.lock, finished.json), Ray
Train's checkpoints and its own bookkeeping, offmeta's restart count.

One run: the shipped sinusoid sample uploaded to moto's S3 server (serial, over loopback),
``learners.num_learners`` workers, ``--checkpoints`` checkpoints; every request the server
answers is taken from moto's request recorder. The figures are per checkpoint (and per
worker and checkpoint), per run start and per read of the dataset: what docs/run-storage.md
scales to 100 workers.

Run: ``.venv/bin/python bench/run_storage.py [--workers N] [--checkpoints N]``. Each figure
is written as a record (``bench/records.py``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import write_record
from flows.process.runtime import set_quiet_environment

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "samples" / "sinusoid"
CHECKPOINT_EVERY = 10
BUCKET = "offmeta-bench-runs"


def _config(workers: int, checkpoints: int):
    from flows.config import validate_config

    return validate_config(
        {
            "data": {
                "train": f"s3://{BUCKET}/data/train",
                "heldout": f"s3://{BUCKET}/data/heldout",
            },
            "tasks": {"support": 10, "query": 10, "meta_batch": 5},
            "learners": {"num_learners": workers},
            "training": {
                "iterations": checkpoints * CHECKPOINT_EVERY,
                "log_every": CHECKPOINT_EVERY,
                "checkpoint_every": CHECKPOINT_EVERY,
                "checkpoint_dir": f"s3://{BUCKET}/runs",
            },
            "artifacts": {"name": "bench-run-storage", "root": f"s3://{BUCKET}/store"},
            "ray": {"num_cpus": 2},
        }
    )


def _purpose(method: str, url: str) -> str:
    """What the request at ``url`` was for, from the key (or the listed prefix)."""
    parts = urlsplit(url)
    key = unquote(parts.path).lstrip("/").partition("/")[2]
    if not key:
        key = parse_qs(parts.query).get("prefix", [""])[0]
    if key.startswith("data/"):
        return "dataset"
    segments = key.split("/")
    if segments[0] != "runs" or len(segments) < 3:
        return "run records"  # listing the runs root, or a run's own prefix
    if segments[2] != "ray":
        return "run records"
    if "offmeta-attempts" in key:
        return "restart count"
    if len(segments) > 4 and segments[4].startswith("checkpoint_"):
        return "checkpoints"
    return "ray bookkeeping"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--checkpoints", type=int, default=4)
    args = parser.parse_args()
    set_quiet_environment()
    with tempfile.TemporaryDirectory(prefix="offmeta-bench-") as scratch:
        recording = Path(scratch) / "requests.jsonl"
        os.environ["MOTO_RECORDER_FILEPATH"] = str(recording)
        counts = _run(args.workers, args.checkpoints, recording)
    _report(counts, args.workers, args.checkpoints)


def _run(workers: int, checkpoints: int, recording: Path) -> collections.Counter:
    import boto3
    import ray

    from flows.runs.run_dirs import open_run
    from flows.scale_out import train_on_ray
    from flows.stages.datasets import validate_datasets
    from tests.helpers.s3_server import client_environment, moto_server

    with moto_server("serial") as endpoint:
        os.environ.update(client_environment(endpoint))
        client = boto3.client("s3")
        client.create_bucket(Bucket=BUCKET)
        for path in sorted(SAMPLE.rglob("*.parquet")):
            client.upload_file(str(path), BUCKET, f"data/{path.relative_to(SAMPLE)}")
        cfg = _config(workers, checkpoints)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            _recorder(endpoint, "start-recording")
            datasets = validate_datasets(cfg)
            with open_run(cfg, resume=None, flow_run_id="bench") as run:
                train_on_ray(cfg, datasets.train, run_dir=run.path)
                run.finish("bench-run-storage:1", f"s3://{BUCKET}/store/x")
            _recorder(endpoint, "stop-recording")
        finally:
            ray.shutdown()
    counts: collections.Counter = collections.Counter()
    for line in recording.read_text().splitlines():
        entry = json.loads(line)
        counts[(_purpose(entry["method"], entry["url"]), entry["method"])] += 1
    return counts


def _recorder(endpoint: str, action: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/recorder/{action}", method="POST")
    with urllib.request.urlopen(request, timeout=30):
        pass


def _report(counts: collections.Counter, workers: int, checkpoints: int) -> None:
    by_purpose: collections.Counter = collections.Counter()
    for (purpose, _method), count in counts.items():
        by_purpose[purpose] += count
    for (purpose, method), count in sorted(counts.items()):
        print(f"{purpose:16} {method:7} {count:6d}")
    shape = {"workers": workers, "checkpoints": checkpoints, "checkpoint_every": CHECKPOINT_EVERY}
    details = {f"{purpose} {method}": count for (purpose, method), count in sorted(counts.items())}
    per_checkpoint = by_purpose["checkpoints"] / checkpoints
    figures = [
        ("1-checkpoint-requests", "S3 requests per checkpoint (all workers)", per_checkpoint),
        (
            "2-checkpoint-requests-per-worker",
            "S3 requests per checkpoint and worker",
            per_checkpoint / workers,
        ),
        (
            "3-bookkeeping-requests",
            "S3 requests of Ray Train's bookkeeping per checkpoint (run state, markers)",
            by_purpose["ray bookkeeping"] / checkpoints,
        ),
        (
            "4-run-record-requests",
            "S3 requests of offmeta's run records for one run (start, lock, finish)",
            by_purpose["run records"] + by_purpose["restart count"],
        ),
        (
            "5-dataset-requests",
            "S3 requests of validating and reading the dataset",
            by_purpose["dataset"],
        ),
    ]
    for figure, description, value in figures:
        print(f"{figure}: {value:g} ({description})")
        write_record(
            "run_storage",
            figure,
            description,
            float(value),
            "requests",
            shape=shape,
            details=details,
        )


if __name__ == "__main__":
    main()
