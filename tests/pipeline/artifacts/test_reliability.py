"""The artifact store under concurrency, crashes and corruption (issue 5 reliability list),
against both backends: a local directory and S3 on a loopback server (issue 14). Publishers in
processes of their own (racing, killed) are in ``test_publisher_processes.py``."""

from __future__ import annotations

import hashlib
import re
import threading

import pytest

from pipeline.artifacts import AliasConflictError, IntegrityError
from tests.helpers.artifact_backends import blob_key, filled_params, publish_filled


@pytest.mark.timeout(30)
def test_on_stage_reports_the_two_crash_points_in_order_and_only_for_a_new_version(storage):
    store = storage.store()
    stages: list[str] = []
    publish_filled(store, 1.0, idempotency_key="run-1", on_stage=stages.append)
    assert stages == ["blobs-written", "manifest-staged"]
    stages.clear()
    publish_filled(store, 1.0, idempotency_key="run-1", on_stage=stages.append)  # a known key
    assert stages == []


@pytest.mark.timeout(30)
def test_corrupted_params_blob_fails_verify_naming_file_and_both_digests(storage, tmp_path):
    store = storage.store()
    ref = publish_filled(store, 1.0)
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
    ref = publish_filled(store, 1.0)
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
        publish_filled(store, value)
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
        publish_filled(store, value)
    with pytest.raises(AliasConflictError) as raised:
        store.set_alias("model", "latest", 2, expected=3)
    assert str(raised.value) == (
        "refusing to move model@latest back from version 3 to 2: 'latest' only moves "
        "forward; use another alias (e.g. 'prod') to pin a version"
    )
    store.set_alias("model", "latest", 3, expected=3)
    assert store.get("model").version == 3
    assert publish_filled(store, 4.0).version == 4
    assert store.aliases("model") == {"latest": 4}


@pytest.mark.timeout(30)
def test_concurrent_compare_and_swap_lets_exactly_one_caller_win(storage):
    store = storage.store()
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        publish_filled(store, value)
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
    first = publish_filled(store, 1.0, idempotency_key="flow-run-42/publish")
    # A retry after a lost reply: possibly different numbers, same key -> same version.
    retry = publish_filled(store, 1.5, idempotency_key="flow-run-42/publish")
    assert retry == first
    assert store.list_versions("model") == [1]
    other = publish_filled(store, 1.0, idempotency_key="flow-run-43/publish")
    assert other.version == 2
    assert store.get("model", version=1).idempotency_key == "flow-run-42/publish"
    # The key is per artifact name.
    elsewhere = store.publish(
        "other",
        filled_params(1.0),
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
        refs.append(publish_filled(storage.store(), value, idempotency_key="same"))

    threads = [threading.Thread(target=publish, args=(float(v),)) for v in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert len(refs) == 4 and len(set(refs)) == 1
    assert storage.store().list_versions("model") == [1]
