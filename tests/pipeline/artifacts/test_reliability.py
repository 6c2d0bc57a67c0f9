"""The artifact store under concurrency, crashes and corruption (issue 5 reliability list),
against both backends: a local directory and S3 on a loopback server (issue 14)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.artifacts import (
    AliasConflictError,
    ArtifactRef,
    ArtifactStore,
    GcReport,
    IntegrityError,
)
from tests.helpers.artifact_backends import BACKENDS, Storage, blob_key, make_storage
from tests.helpers.paths import REPO

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


def _params(value: float) -> dict[str, dict[str, torch.Tensor]]:
    return {"default_policy": {"w": torch.full((4,), value), "b": torch.zeros(2)}}


def _publish(store: ArtifactStore, value: float, **kwargs: Any) -> ArtifactRef:
    return store.publish(
        "model", _params(value), metrics={"loss": value}, config={}, lineage={}, **kwargs
    )


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return make_storage(request, tmp_path)


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
    first = _publish(store, 1.0, idempotency_key="run-1")
    _kill_publisher_at(storage.root, stage, tmp_path / "ready")

    # Nothing of the killed publish is visible.
    assert store.list_versions("model") == [1]
    assert store.aliases("model") == {"latest": 1}
    assert store.get("model").version == 1
    assert storage.listed("names/model/versions/") == ["names/model/versions/00000001.json"]

    # The number it would have taken is still free, and its idempotency key is unused
    # (the publish never happened); its claim (manifest-staged) is released by the kernel
    # (local) or taken over once its lease ran out (S3).
    second = _publish(store, 2.0, idempotency_key="run-2")
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


@pytest.mark.timeout(30)
def test_on_stage_reports_the_two_crash_points_in_order_and_only_for_a_new_version(storage):
    store = storage.store()
    stages: list[str] = []
    _publish(store, 1.0, idempotency_key="run-1", on_stage=stages.append)
    assert stages == ["blobs-written", "manifest-staged"]
    stages.clear()
    _publish(store, 1.0, idempotency_key="run-1", on_stage=stages.append)  # a known key
    assert stages == []


@pytest.mark.timeout(60)
def test_dangling_idempotency_record_from_a_crash_is_ignored_and_collected(storage, tmp_path):
    _kill_publisher_at(storage.root, "manifest-staged", tmp_path / "ready")
    store = storage.store(lock_timeout=10)
    assert store.list_names() == []
    # The key record written before the crash points at version 1, which another
    # publisher (different key) now takes; the retry must not be mistaken for it.
    other = _publish(store, 3.0, idempotency_key="someone-else")
    assert other.version == 1
    report = store.gc(older_than=0)
    # the dangling key record, the crashed publish's params and metrics
    assert (report.temp_files, report.key_records, report.blobs) == (0, 1, 2)
    retried = _publish(store, 7.0, idempotency_key="run-2")
    assert retried.version == 2
    assert store.get("model", version=2).idempotency_key == "run-2"
    assert store.gc(older_than=0) == GcReport(temp_files=0, blobs=0, freed_bytes=0, key_records=0)


@pytest.mark.timeout(30)
def test_corrupted_params_blob_fails_verify_naming_file_and_both_digests(storage, tmp_path):
    store = storage.store()
    ref = _publish(store, 1.0)
    blob = blob_key(ref.digest)
    data = bytearray(storage.read(blob))
    data[-1] ^= 0xFF  # last byte of the last tensor in the file
    storage.write(blob, bytes(data))

    with pytest.raises(IntegrityError) as raised:
        store.verify(ref)
    (problem,) = raised.value.problems
    match = re.fullmatch(
        rf"model:1 file 'params.safetensors' \(blob {re.escape(storage.location(blob))}\) is "
        rf"corrupt: expected digest {ref.digest}, found (sha256:[0-9a-f]{{64}}); "
        rf"tensors that differ: '(default_policy/[bw])'",
        problem,
    )
    assert match, problem
    assert match.group(1) != ref.digest
    with pytest.raises(IntegrityError, match=re.escape(f"expected digest {ref.digest}, found")):
        store.load_params(ref)
    with pytest.raises(IntegrityError):
        store.export(ref, tmp_path / "export")
    assert not (tmp_path / "export").exists()


@pytest.mark.timeout(30)
def test_corrupted_truncated_and_missing_blobs_are_each_reported(storage):
    store = storage.store()
    ref = _publish(store, 1.0)
    manifest = store.get("model")
    metrics_blob = blob_key(manifest.files["metrics.json"].digest)
    storage.write(metrics_blob, b'{"loss": 0.0}\n')
    found = "sha256:" + hashlib.sha256(b'{"loss": 0.0}\n').hexdigest()
    params_blob = blob_key(ref.digest)
    storage.write(params_blob, storage.read(params_blob)[:5])
    config_digest = manifest.files["config.json"].digest
    config_blob = blob_key(config_digest)
    storage.delete(config_blob)

    with pytest.raises(IntegrityError) as raised:
        store.verify("model:1")
    params_at, metrics_at = storage.location(params_blob), storage.location(metrics_blob)
    assert raised.value.problems == (
        f"model:1 file 'config.json' (blob {storage.location(config_blob)}) is missing; "
        f"expected digest {config_digest}",
        f"model:1 file 'metrics.json' (blob {metrics_at}) is corrupt: "
        f"expected digest {manifest.files['metrics.json'].digest}, found {found}",
        f"model:1 file 'params.safetensors' (blob {params_at}): expected digest {ref.digest}, "
        f"but {params_at} is not a readable safetensors file: it is 5 bytes long, shorter "
        f"than the 8-byte header length",
    )
    with pytest.raises(IntegrityError, match="not a readable safetensors file"):
        store.load_params("model")


@pytest.mark.timeout(30)
def test_stale_alias_compare_and_swap_is_refused(storage):
    store = storage.store()
    for value in (1.0, 2.0, 3.0):
        _publish(store, value)
    store.set_alias("model", "prod", 1, expected=None)
    with pytest.raises(AliasConflictError) as raised:
        store.set_alias("model", "prod", 2, expected=None)
    assert str(raised.value) == (
        "refusing to move model@prod to version 2: it points at version 1, but the caller "
        "expected it not to exist; re-read the alias and retry"
    )
    store.set_alias("model", "prod", 2, expected=1)
    with pytest.raises(
        AliasConflictError,
        match="it points at version 2, but the caller expected it to point at version 1",
    ):
        store.set_alias("model", "prod", 3, expected=1)
    with pytest.raises(
        AliasConflictError,
        match="it does not exist, but the caller expected it to point at version 1",
    ):
        store.set_alias("model", "staging", 3, expected=1)
    assert store.aliases("model") == {"latest": 3, "prod": 2}
    # prod may go back (it is a pin); only latest is forward-only.
    store.set_alias("model", "prod", 1, expected=2)
    assert store.get("model", alias="prod").version == 1


@pytest.mark.timeout(30)
def test_latest_never_moves_backwards(storage):
    store = storage.store()
    for value in (1.0, 2.0, 3.0):
        _publish(store, value)
    with pytest.raises(AliasConflictError) as raised:
        store.set_alias("model", "latest", 2, expected=3)
    assert str(raised.value) == (
        "refusing to move model@latest back from version 3 to 2: 'latest' only moves "
        "forward; use another alias (e.g. 'prod') to pin a version"
    )
    store.set_alias("model", "latest", 3, expected=3)
    assert store.get("model").version == 3
    assert _publish(store, 4.0).version == 4
    assert store.aliases("model") == {"latest": 4}


@pytest.mark.timeout(30)
def test_concurrent_compare_and_swap_lets_exactly_one_caller_win(storage):
    store = storage.store()
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        _publish(store, value)
    store.set_alias("model", "prod", 1, expected=None)
    barrier = threading.Barrier(4)
    outcomes: dict[int, str] = {}

    def move(target: int) -> None:
        barrier.wait(timeout=10)
        try:
            storage.store().set_alias("model", "prod", target, expected=1)
            outcomes[target] = "moved"
        except AliasConflictError:
            outcomes[target] = "refused"

    threads = [threading.Thread(target=move, args=(t,)) for t in (2, 3, 4, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert sorted(outcomes.values()) == ["moved", "refused", "refused", "refused"]
    winner = next(t for t, outcome in outcomes.items() if outcome == "moved")
    assert store.aliases("model")["prod"] == winner


@pytest.mark.timeout(30)
def test_retried_publish_with_the_same_key_returns_the_same_version(storage):
    store = storage.store()
    first = _publish(store, 1.0, idempotency_key="flow-run-42/publish")
    # A retry after a lost reply: possibly different numbers, same key -> same version.
    retry = _publish(store, 1.5, idempotency_key="flow-run-42/publish")
    assert retry == first
    assert store.list_versions("model") == [1]
    other = _publish(store, 1.0, idempotency_key="flow-run-43/publish")
    assert other.version == 2
    assert store.get("model", version=1).idempotency_key == "flow-run-42/publish"
    # The key is per artifact name.
    elsewhere = store.publish(
        "other",
        _params(1.0),
        metrics={},
        config={},
        lineage={},
        idempotency_key="flow-run-42/publish",
    )
    assert (elsewhere.name, elsewhere.version) == ("other", 1)


@pytest.mark.timeout(30)
def test_concurrent_retries_with_one_key_create_one_version(storage):
    barrier = threading.Barrier(4)
    refs = []

    def publish(value: float) -> None:
        barrier.wait(timeout=10)
        refs.append(_publish(storage.store(), value, idempotency_key="same"))

    threads = [threading.Thread(target=publish, args=(float(v),)) for v in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(refs) == 4 and len(set(refs)) == 1
    assert storage.store().list_versions("model") == [1]
