"""What only the S3 backend has: errors naming s3:// URIs, claims with leases, gc's age
threshold, the CLI on an s3:// root. Everything else runs for both backends in
test_artifacts_store.py and test_artifacts_reliability.py."""

from __future__ import annotations

import hashlib
import json
import re
import time

import boto3
import pytest
import torch
from botocore.config import Config

from flows.cli import main as offmeta
from pipeline.artifacts import (
    ArtifactError,
    ArtifactStore,
    GcReport,
    LockTimeoutError,
    StorageError,
)
from tests.helpers.artifact_backends import Storage, blob_key

pytestmark = pytest.mark.timeout(60)


def _publish(store: ArtifactStore, value: float = 1.0, **kwargs) -> object:
    params = {"default_policy": {"w": torch.full((3,), value)}}
    return store.publish("model", params, metrics={"v": value}, config={}, lineage={}, **kwargs)


def _claim_key(idempotency_key: str) -> str:
    return f"names/model/keys/{hashlib.sha256(idempotency_key.encode()).hexdigest()}.claim"


def test_versions_are_addressed_by_s3_uris(s3_root):
    store = ArtifactStore(s3_root)
    ref = _publish(store)
    assert store.root == s3_root and repr(store) == f"ArtifactStore({s3_root!r})"
    assert ref.uri == f"{s3_root}/names/model/versions/00000001.json"
    loaded = store.load_params("model:1")
    assert torch.equal(loaded["default_policy"]["w"], torch.full((3,), 1.0))


def test_a_missing_bucket_is_named_with_the_endpoint(s3_endpoint):
    store = ArtifactStore("s3://no-such-bucket/models")
    with pytest.raises(StorageError) as raised:
        store.list_names()
    assert str(raised.value) == (
        "cannot list s3://no-such-bucket/models/names: the bucket 'no-such-bucket' does not "
        f"exist at {s3_endpoint}; create it or fix the store root"
    )
    with pytest.raises(StorageError, match=r"^cannot (read|write) s3://no-such-bucket/models/"):
        _publish(store)


def test_an_unreachable_endpoint_is_named_with_the_uri(s3_root):
    client = boto3.session.Session().client(
        "s3",
        endpoint_url="http://127.0.0.1:9",
        config=Config(retries={"max_attempts": 1}, connect_timeout=2),
    )
    with pytest.raises(StorageError) as raised:
        ArtifactStore(s3_root, client=client).get("model:1")
    assert str(raised.value).startswith(
        f"cannot read {s3_root}/names/model/versions/00000001.json at http://127.0.0.1:9: "
        "Could not connect to the endpoint URL"
    )


def test_a_client_is_refused_for_a_local_root(tmp_path):
    with pytest.raises(ArtifactError) as raised:
        ArtifactStore(tmp_path / "store", client=object())
    assert str(raised.value) == (
        f"client= is for s3:// stores; {str(tmp_path / 'store')!r} is a local directory"
    )


def test_gc_leaves_young_leftovers_to_publishers_still_running(s3_root):
    storage = Storage("s3", s3_root)
    store = storage.store()
    _publish(store)
    orphan = blob_key("sha256:" + hashlib.sha256(b"orphan").hexdigest())
    storage.write(orphan, b"orphan")  # what a publisher in flight has just stored
    assert store.gc() == GcReport(temp_files=0, blobs=0, freed_bytes=0, key_records=0)
    assert orphan in storage.listed("blobs/")
    assert store.gc(older_than=0) == GcReport(temp_files=0, blobs=1, freed_bytes=6, key_records=0)
    assert orphan not in storage.listed("blobs/")
    store.verify("model:1")
    with pytest.raises(ArtifactError, match=r"^older_than must be >= 0 seconds, got -1$"):
        store.gc(older_than=-1)


def test_a_reused_blob_is_marked_in_use_again(s3_root):
    storage = Storage("s3", s3_root)
    store = storage.store()
    first = _publish(store)
    bucket, prefix = s3_root.removeprefix("s3://").split("/", 1)
    client = boto3.session.Session().client("s3")
    key = f"{prefix}/{blob_key(first.digest)}"
    assert "offmeta-reused" not in client.head_object(Bucket=bucket, Key=key)["Metadata"]
    again = _publish(store)  # same tensors: the params blob is reused, not uploaded
    assert (again.version, again.digest) == (2, first.digest)
    assert "offmeta-reused" in client.head_object(Bucket=bucket, Key=key)["Metadata"]
    store.verify(again)


def test_a_live_claim_makes_another_publisher_of_the_key_wait_and_give_up(s3_root):
    storage = Storage("s3", s3_root)
    live = {"token": "other", "host": "elsewhere", "pid": 1, "lease_s": 600.0}
    storage.write(_claim_key("run-7"), json.dumps(live).encode())
    store = storage.store(lock_timeout=1)
    with pytest.raises(LockTimeoutError) as raised:
        _publish(store, idempotency_key="run-7")
    assert re.fullmatch(
        rf"gave up after 1 s waiting for the claim {s3_root}/{_claim_key('run-7')}: another "
        r"publisher has held it for \d+ s \(a claim left by a crashed publisher is taken over "
        r"after 601 s\)",
        str(raised.value),
    ), str(raised.value)
    assert store.list_versions("model") == []


def test_a_claim_whose_lease_ran_out_is_taken_over_and_released(s3_root):
    storage = Storage("s3", s3_root)
    dead = {"token": "crashed", "host": "elsewhere", "pid": 1, "lease_s": 0.0}
    storage.write(_claim_key("run-8"), json.dumps(dead).encode())
    ref = _publish(storage.store(lock_timeout=5), idempotency_key="run-8")
    assert ref.version == 1
    assert _claim_key("run-8") not in storage.listed("names/model/keys/")


def test_a_holder_past_half_its_lease_publishes_nothing(s3_root):
    def slow_after_claiming(stage: str) -> None:
        if stage == "manifest-staged":
            time.sleep(0.6)

    store = ArtifactStore(s3_root, lock_timeout=2)  # lease 1 s; the holder stops at 0.5 s
    with pytest.raises(ArtifactError) as raised:
        _publish(store, idempotency_key="slow", on_stage=slow_after_claiming)
    assert re.fullmatch(
        rf"held the claim {s3_root}/{_claim_key('slow')} for \d+\.\d s, more than half its "
        r"1 s lease; another publisher of the same idempotency key may take it over now, so "
        r"nothing was published; retry the publish",
        str(raised.value),
    ), str(raised.value)
    assert store.list_versions("model") == []
    assert _claim_key("slow") not in Storage("s3", s3_root).listed()  # released on the way out
    assert _publish(store, idempotency_key="slow").version == 1


def test_the_cli_works_on_an_s3_root(s3_root, tmp_path, capsys):
    store = ArtifactStore(s3_root)
    _publish(store, 1.0)
    _publish(store, 2.0, history={"loss": [1.0, 0.5]})
    assert offmeta(["artifacts", "list", "--root", s3_root, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["name"], row["versions"], row["latest"]) == ("model", 2, 2)
    assert offmeta(["artifacts", "show", "model:2", "--root", s3_root]) == 0
    assert f"  manifest:    {s3_root}/names/model/versions/00000002.json\n" in (
        capsys.readouterr().out
    )
    assert offmeta(["artifacts", "verify", "model:1", "model@latest", "--root", s3_root]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "OK      model:1  (3 files verified)",
        "OK      model:2  (6 files verified)",
    ]
    assert offmeta(["artifacts", "alias", "model", "prod", "1", "--root", s3_root]) == 0
    assert capsys.readouterr().out == "model@prod: (new) -> 1\n"
    target = str(tmp_path / "out")
    assert offmeta(["artifacts", "export", "model@prod", target, "--root", s3_root]) == 0
    assert (tmp_path / "out" / "params.safetensors").is_file()
    capsys.readouterr()
    assert offmeta(["artifacts", "gc", "--older-than", "0", "--root", s3_root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["blobs"] == 0
    assert offmeta(["artifacts", "show", "nope", "--root", s3_root]) == 1
    assert capsys.readouterr().err == (
        f"offmeta artifacts show: error: no artifact named 'nope' in {s3_root} (artifacts: model)\n"
    )
    assert offmeta(["artifacts", "list", "--root", "gs://models/x"]) == 1
    assert capsys.readouterr().err.startswith(
        "offmeta artifacts list: error: artifact store root 'gs://models/x' has the scheme"
    )
