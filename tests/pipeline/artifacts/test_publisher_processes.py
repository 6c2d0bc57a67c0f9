"""The artifact store against publishers in processes of their own (issue 5 reliability
list), on both backends: eight racing processes get gap-free versions, and one killed
mid-publish leaves no partial version. The store's other reliability tests (threads,
crashes, corruption) are in ``test_reliability.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from pipeline.artifacts import GcReport
from tests.helpers.artifact_backends import blob_key, publish_filled
from tests.helpers.paths import REPO

pytestmark = pytest.mark.system

REPO = REPO

# Imports torch once, then forks PROCS publishers (separate processes, each with its own
# file descriptors, which is what the store's flock coordination is about). They start
# publishing together when the test creates OUT/go.
_CONCURRENT_PUBLISHERS = textwrap.dedent(
    """
    import json, os, pathlib, sys, time, traceback
    import torch
    from pipeline.artifacts import ArtifactStore

    root, out = sys.argv[1], pathlib.Path(sys.argv[4])
    procs, count = int(sys.argv[2]), int(sys.argv[3])

    def publisher(proc):
        deadline = time.monotonic() + 60
        while not (out / "go").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("no go signal")
            time.sleep(0.005)
        store = ArtifactStore(root)
        published = []
        for n in range(count):
            params = {"default_policy": {"w": torch.full((3,), float(proc * 100 + n))}}
            metrics = {"proc": proc, "n": n}
            ref = store.publish("shared", params, metrics=metrics, config={}, lineage={})
            published.append([ref.version, ref.digest, proc, n])
        (out / f"published-{proc}.json").write_text(json.dumps(published))

    pids = []
    for proc in range(procs):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                publisher(proc)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    (out / "ready").touch()
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    sys.exit(0 if codes == [0] * procs else f"publisher exit codes {codes}")
    """
)

# Publishes one version but stops at the named stage of ArtifactStore.publish (reported
# through the on_stage callback it is given), announces it through a file and waits to be
# killed. Its lock timeout is short: on S3 the claim it leaves is taken over after half of it.
_PAUSED_PUBLISHER = textwrap.dedent(
    """
    import pathlib, sys, time
    import torch
    from pipeline.artifacts import ArtifactStore

    root, stage, ready = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    lock_timeout = float(sys.argv[4])

    def pause(reached):
        if reached == stage:
            ready.write_text(reached)
            time.sleep(600)

    ArtifactStore(root, lock_timeout=lock_timeout).publish(
        "model",
        {"default_policy": {"w": torch.full((4,), 7.0)}},
        metrics={"loss": 1.0},
        config={},
        lineage={},
        idempotency_key="run-2",
        on_stage=pause,
    )
    sys.exit("publish was not interrupted")
    """
)


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _kill_publisher_at(root: str, stage: str, ready: Path) -> None:
    """Start a publisher that pauses at ``stage`` of publishing, and SIGKILL it there."""
    child = _python(_PAUSED_PUBLISHER, root, stage, str(ready), "4")
    try:
        _wait_for(lambda: ready.exists() or child.poll() is not None, 60, f"stage {stage}")
        assert ready.exists(), child.communicate(timeout=10)[1]
        os.kill(child.pid, signal.SIGKILL)
        child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
    assert child.returncode == -signal.SIGKILL


def _wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


@pytest.mark.timeout(300)
def test_eight_processes_publishing_ten_versions_each_get_versions_1_to_80(storage, tmp_path):
    launcher = _python(_CONCURRENT_PUBLISHERS, storage.root, "8", "10", str(tmp_path))
    try:
        _wait_for(
            lambda: (tmp_path / "ready").exists() or launcher.poll() is not None, 60, "publishers"
        )
        (tmp_path / "go").touch()
        _, stderr = launcher.communicate(timeout=240)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait(timeout=10)
    assert launcher.returncode == 0, stderr

    published = [
        row
        for proc in range(8)
        for row in json.loads((tmp_path / f"published-{proc}.json").read_text())
    ]
    store = storage.store()
    assert sorted(version for version, *_ in published) == list(range(1, 81))
    assert store.list_versions("shared") == list(range(1, 81))
    assert store.aliases("shared") == {"latest": 80}
    for version, digest, proc, n in published:
        manifest = store.verify(f"shared:{version}")
        assert manifest.params_digest == digest
        assert manifest.metrics == {"proc": proc, "n": n}
        loaded = store.load_params(f"shared:{version}")
        assert torch.equal(loaded["default_policy"]["w"], torch.full((3,), float(proc * 100 + n)))
    # Each process saw its own versions in increasing order.
    for proc in range(8):
        mine = [version for version, _, p, _ in published if p == proc]
        assert mine == sorted(mine)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("stage", ["blobs-written", "manifest-staged"])
def test_publisher_killed_mid_publish_leaves_no_partial_version(storage, tmp_path, stage):
    store = storage.store(lock_timeout=10)
    first = publish_filled(store, 1.0, idempotency_key="run-1")
    _kill_publisher_at(storage.root, stage, tmp_path / "ready")

    # Nothing of the killed publish is visible.
    assert store.list_versions("model") == [1]
    assert store.aliases("model") == {"latest": 1}
    assert store.get("model").version == 1
    assert storage.listed("names/model/versions/") == ["names/model/versions/00000001.json"]

    # The number it would have taken is still free, and its idempotency key is unused
    # (the publish never happened); its claim (manifest-staged) is released by the kernel
    # (local) or taken over once its lease ran out (S3).
    second = publish_filled(store, 2.0, idempotency_key="run-2")
    assert second.version == 2
    assert store.get("model").version == 2
    store.verify(first)
    store.verify(second)

    report = store.gc(older_than=0)
    # the killed publish's params (its JSON files equal version 1's); no staged files
    assert report == GcReport(temp_files=0, blobs=1, freed_bytes=report.freed_bytes, key_records=0)
    referenced = {
        blob_key(entry.digest)
        for version in (1, 2)
        for entry in store.get("model", version=version).files.values()
    }
    assert set(storage.listed("blobs/")) == referenced
    assert store.verify("model:1") and store.verify("model:2")


@pytest.mark.timeout(60)
def test_dangling_idempotency_record_from_a_crash_is_ignored_and_collected(storage, tmp_path):
    _kill_publisher_at(storage.root, "manifest-staged", tmp_path / "ready")
    store = storage.store(lock_timeout=10)
    assert store.list_names() == []
    # The key record written before the crash points at version 1, which another
    # publisher (different key) now takes; the retry must not be mistaken for it.
    other = publish_filled(store, 3.0, idempotency_key="someone-else")
    assert other.version == 1
    report = store.gc(older_than=0)
    # the dangling key record, the crashed publish's params and metrics
    assert (report.temp_files, report.key_records, report.blobs) == (0, 1, 2)
    retried = publish_filled(store, 7.0, idempotency_key="run-2")
    assert retried.version == 2
    assert store.get("model", version=2).idempotency_key == "run-2"
    assert store.gc(older_than=0) == GcReport(temp_files=0, blobs=0, freed_bytes=0, key_records=0)
