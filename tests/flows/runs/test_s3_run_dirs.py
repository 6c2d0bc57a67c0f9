"""Run directories on S3 (``training.checkpoint_dir: s3://...``): the same records as on a
local disk, written with conditional writes, and a lock that refuses a second driver while
its holder lives and is taken over once it is gone; other schemes are refused."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from flows.config import ConfigError, MetaTrainConfig
from flows.runs.retention import prune_runs
from flows.runs.run_dirs import (
    RunDirError,
    abandoned_flow_runs,
    find_resumable,
    live_pid,
    open_run,
    read_run,
)
from flows.runs.run_storage import run_at
from tests.helpers.flow_runs import tiny_config
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(120)


def _cfg(work: Path, root: str, overrides: tuple[str, ...] = ()) -> MetaTrainConfig:
    return tiny_config(
        work / "data",
        work,
        ["learners.num_learners=1", f"training.checkpoint_dir={root}", *overrides],
    )


def _keys(uri: str) -> list[str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(item["Key"][len(prefix) + 1 :] for item in listed.get("Contents", ()))


def test_an_s3_run_records_its_starts_holds_its_lock_and_finishes_once(
    s3_root: str, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, s3_root)
    with open_run(cfg, resume=None, flow_run_id="flow-a") as run:
        assert run.path == f"{s3_root}/flow-a"
        assert (run.run_id, run.earlier_flow_runs) == ("flow-a", [])
        assert live_pid(run.path) == os.getpid()
        assert _keys(run.path) == ["run.json", "run.lock"]
        with pytest.raises(RunDirError) as caught, open_run(cfg, resume=run.path, flow_run_id="b"):
            pass
        assert str(caught.value) == (
            f"{run.path}: it is running: process {os.getpid()} on {socket.gethostname()} "
            "holds its run.lock; wait for that run to end or stop it first"
        )
    assert live_pid(run.path) is None
    assert find_resumable(cfg) == run.path

    with open_run(cfg, resume=run.path, flow_run_id="flow-b") as resumed:
        assert resumed.earlier_flow_runs == ["flow-a"]
        resumed.finish("tiny-robot:3", f"{s3_root}/names/3.json")
        with pytest.raises(RunDirError) as caught:
            resumed.finish("tiny-robot:4", "again")
        assert str(caught.value) == (
            f"{run.path}/finished.json exists already; expected to write it once"
        )
    record = read_run(run.path)
    assert [start["flow_run_id"] for start in record.starts] == ["flow-a", "flow-b"]
    assert record.finished["artifact"] == "tiny-robot:3"
    assert _keys(run.path) == ["finished.json", "run.json"]
    with pytest.raises(RunDirError) as caught:
        open_run(cfg, resume=None, flow_run_id="flow-a").__enter__()
    assert str(caught.value) == (
        f"{run.path} exists already; a new run needs a new directory (resume that one with "
        "--resume, or remove it)"
    )


def test_the_lock_of_a_killed_driver_is_taken_over_and_a_live_one_elsewhere_is_not(
    s3_root: str, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, s3_root)
    with open_run(cfg, resume=None, flow_run_id="killed"):
        pass
    run = f"{s3_root}/killed"
    # A driver that dies holding the lock (os._exit: no clean-up, as SIGKILL) leaves it behind.
    script = (
        "import os, sys; from flows.runs.run_storage import run_at\n"
        "with run_at(sys.argv[1]).hold(): os._exit(0)\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, run],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        check=True,
        timeout=60,
    )
    assert "run.lock" in _keys(run)
    assert live_pid(run) is None
    assert abandoned_flow_runs(s3_root) == [("killed", run)]
    with open_run(cfg, resume=run, flow_run_id="again") as resumed:
        assert live_pid(resumed.path) == os.getpid()

    # A lock renewed just now by a process on another host is held.
    bucket, _, prefix = run.removeprefix("s3://").partition("/")
    holder = {"host": "node-7", "pid": 4242, "token": "x", "lease_s": 60.0}
    boto3.client("s3").put_object(
        Bucket=bucket, Key=f"{prefix}/run.lock", Body=json.dumps(holder).encode()
    )
    with pytest.raises(RunDirError) as caught:
        find_resumable(cfg)
    assert str(caught.value) == (
        f"no unfinished run of 'tiny-robot' with this config under {s3_root} (unfinished runs "
        f"of that name: {run}: it is running: process 4242 on node-7 holds its run.lock; wait "
        "for that run to end or stop it first); run without --resume to start a new run, or "
        "name a run directory with --resume RUN_DIR"
    )


def test_pruning_on_s3_removes_old_finished_runs_and_leaves_held_ones(
    s3_root: str, tmp_path: Path
) -> None:
    cfg = _cfg(tmp_path, s3_root)
    for name in ("done-0", "done-1", "done-2"):
        with open_run(cfg, resume=None, flow_run_id=name) as run:
            run.finish(f"tiny-robot:{name[-1]}", "x")
    with open_run(cfg, resume=None, flow_run_id="held") as held:
        removed = prune_runs(s3_root, keep_finished=1, keep_unfinished_days=0.0001, now=2e9)
        assert removed == [f"{s3_root}/done-1", f"{s3_root}/done-0"]
        assert _keys(f"{s3_root}/done-0") == []
        assert [record.path for record in (read_run(held.path),)] == [f"{s3_root}/held"]
    assert prune_runs(s3_root, keep_finished=1, keep_unfinished_days=0.0001, now=2e9) == [
        f"{s3_root}/held"
    ]


def test_schemes_other_than_paths_and_s3_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        tiny_config(tmp_path / "data", tmp_path, ["training.checkpoint_dir=gs://bucket/runs"])
    assert (
        "training.checkpoint_dir: training.checkpoint_dir 'gs://bucket/runs' has the scheme "
        "'gs://', which offmeta's run storage cannot write to; expected a directory path, a "
        "file:// URI or s3://bucket/prefix"
    ) in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        tiny_config(tmp_path / "data", tmp_path, ["training.checkpoint_dir=s3://bucket/runs"])
    assert (
        "training.checkpoint_dir='s3://bucket/runs' is run storage for Ray Train workers; "
        "learners.num_learners=0 trains in this process, which checkpoints to a local "
        "directory: set learners.num_learners >= 1 or a local checkpoint_dir"
    ) in str(caught.value)
    with pytest.raises(RunDirError) as caught:
        read_run("http://host/runs/abc")
    assert str(caught.value) == (
        "training.checkpoint_dir 'http://host/runs/abc' has the scheme 'http://', which "
        "offmeta's run storage cannot write to; expected a directory path, a file:// URI or "
        "s3://bucket/prefix"
    )
    with pytest.raises(RunDirError) as caught:
        run_at("s3://bucket")
    assert str(caught.value) == (
        "s3://bucket: names a bucket, not a run directory; expected s3://bucket/prefix/<run id>"
    )
