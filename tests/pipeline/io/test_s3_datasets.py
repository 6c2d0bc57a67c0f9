"""``s3://`` datasets on a real S3 HTTP server (moto's, on loopback:
``tests/helpers/s3_server.py``).

The committed point-robot training split is uploaded with boto3; read from the bucket it
validates, fingerprints, reads, streams, samples tasks and compacts exactly as its local
copy does. Endpoint and keys reach pyarrow only through the standard AWS variables that
the ``s3_endpoint`` fixture sets.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import socket
import uuid
from pathlib import Path

import boto3
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract.schema import DatasetError
from pipeline.importers import import_minari, import_rllib
from pipeline.importers.recording_files import natural_key
from pipeline.reads.episodes import inspect_episodes, read_episodes
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.samples import task_samples
from pipeline.writes.compact import compact
from tests.helpers.paths import REPO
from tests.helpers.s3_server import OFFMETA, run_in_repo

REPO = REPO
LOCAL = REPO / "data" / "samples" / "point_robot" / "train"
K, Q = 5, 5


def _new_bucket(endpoint: str) -> str:
    bucket = f"offmeta-{uuid.uuid4().hex[:16]}"
    boto3.session.Session().client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return bucket


def upload(directory: Path, endpoint: str, bucket: str, prefix: str) -> str:
    """Every file below ``directory`` to ``s3://bucket/prefix/<relative path>``."""
    client = boto3.session.Session().client("s3", endpoint_url=endpoint)
    for path in sorted(directory.rglob("*")):
        if path.is_file():
            key = f"{prefix}/{path.relative_to(directory).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
    return f"s3://{bucket}/{prefix}"


@pytest.fixture(scope="module")
def bucket(s3_endpoint) -> str:
    return _new_bucket(s3_endpoint)


@pytest.fixture(scope="module")
def remote(s3_endpoint, bucket) -> str:
    return upload(LOCAL, s3_endpoint, bucket, "datasets/point_robot/train")


def test_validate_on_the_command_line_names_the_s3_root(remote):
    result = run_in_repo([*OFFMETA, "data", "validate", remote])
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{remote}: OK"
    assert f"  root              {remote}" in lines
    assert f"  fingerprint       {inspect_episodes(LOCAL).fingerprint}" in lines


def test_the_fingerprint_and_counts_equal_the_local_copy(remote):
    """The fingerprint hashes relative paths, sizes and bytes: where the files live is
    not part of it."""
    local, s3 = inspect_episodes(LOCAL), inspect_episodes(remote)
    assert s3.fingerprint == local.fingerprint
    assert (s3.num_rows, s3.num_episodes, s3.task_ids) == (
        local.num_rows,
        local.num_episodes,
        local.task_ids,
    )
    assert s3.summary()["root"] == remote


@pytest.mark.timeout(180)
def test_ray_reads_one_epoch_equal_to_the_local_one(remote, ray_session):
    """Ray's read tasks run in worker processes: the filesystem travels pickled, with the
    endpoint and keys in it."""
    local, s3 = read_episodes(LOCAL), read_episodes(remote)
    assert s3.dataset.count() == local.num_rows == 20_000
    options = {"minibatch_size": 1000, "seed": 4}
    [from_s3] = split_for_learners(RowStream(s3, superbatch_rows=20_000), 1, **options)
    [from_disk] = split_for_learners(RowStream(local, superbatch_rows=20_000), 1, **options)
    with from_s3, from_disk:
        got, expected = list(from_s3.take(20)), list(from_disk.take(20))
    for batch, reference in zip(got, expected, strict=True):
        for module, columns in reference.items():
            for name, values in columns.items():
                np.testing.assert_array_equal(batch[module][name].numpy(), values.numpy())


@pytest.mark.timeout(180)
def test_task_samples_equal_the_local_ones_in_memory_and_streamed(remote, ray_session):
    samples = {
        "memory": (
            task_samples(read_episodes(remote), support=K, query=Q),
            task_samples(read_episodes(LOCAL), support=K, query=Q),
        ),
        "stream": (
            task_samples(
                inspect_episodes(remote), support=K, query=Q, mode="stream", memory_budget_mb=0.5
            ),
            task_samples(
                inspect_episodes(LOCAL), support=K, query=Q, mode="stream", memory_budget_mb=0.5
            ),
        ),
    }
    for mode, (s3, local) in samples.items():
        assert s3.summary() == local.summary() and s3.summary()["mode"] == mode
        [from_s3] = split_for_learners(s3, 1, minibatch_size=8, seed=2)
        [from_disk] = split_for_learners(local, 1, minibatch_size=8, seed=2)
        with from_s3, from_disk:
            got, expected = list(from_s3.take(30)), list(from_disk.take(30))
        for meta, reference in zip(got, expected, strict=True):
            for part in ("support", "query"):
                for module, columns in reference[part].items():
                    for name, values in columns.items():
                        np.testing.assert_array_equal(
                            meta[part][module][name].numpy(), values.numpy(), err_msg=mode
                        )


def test_compact_reads_s3_and_writes_the_local_result(remote, tmp_path):
    from_s3 = compact(remote, tmp_path / "from-s3")
    from_disk = compact(LOCAL, tmp_path / "from-disk")
    assert from_s3.fingerprint == from_disk.fingerprint
    assert from_s3.metadata["compacted_from"]["fingerprint"] == inspect_episodes(LOCAL).fingerprint


def test_a_missing_bucket_is_named_with_the_endpoint(s3_endpoint):
    with pytest.raises(DatasetError) as error:
        inspect_episodes("s3://offmeta-no-such-bucket/train")
    assert str(error.value) == (
        "cannot open 's3://offmeta-no-such-bucket/train': bucket 'offmeta-no-such-bucket' does "
        f"not exist at {s3_endpoint}; expected an existing bucket (check the name, and "
        "AWS_ENDPOINT_URL for an S3-compatible server)"
    )


def test_a_missing_prefix_is_named(remote, bucket):
    with pytest.raises(DatasetError) as error:
        inspect_episodes(f"s3://{bucket}/datasets/nothing")
    assert str(error.value) == (
        f"source 's3://{bucket}/datasets/nothing' does not exist; expected a Parquet file, "
        "a directory or a glob"
    )


def test_a_prefix_without_parquet_files_is_named(s3_endpoint, bucket, tmp_path):
    (tmp_path / "notes.txt").write_text("not a dataset")
    notes = upload(tmp_path, s3_endpoint, bucket, "notes")
    with pytest.raises(DatasetError) as error:
        inspect_episodes(notes)
    assert str(error.value) == (
        f"no Parquet files found at '{notes}'; expected *.parquet files (a file, a directory "
        "holding them, a glob, or a list of these)"
    )


def test_an_unreachable_endpoint_is_named(s3_endpoint, monkeypatch):
    with socket.socket() as probe:  # a port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", closed)
    with pytest.raises(DatasetError) as error:
        inspect_episodes("s3://offmeta-any/train")
    assert str(error.value) == (
        f"cannot open 's3://offmeta-any/train': no S3 endpoint answers at {closed}; expected "
        "a reachable S3 server (check AWS_ENDPOINT_URL, or unset it for Amazon S3)"
    )


RLLIB = REPO / "data" / "samples" / "rllib_cartpole" / "recording"
MINARI = REPO / "data" / "samples" / "minari_cartpole" / "parquet"


def test_an_rllib_recording_imports_from_s3_as_from_disk(s3_endpoint, bucket, tmp_path):
    recording = upload(RLLIB, s3_endpoint, bucket, "recordings/rllib")
    from_s3 = import_rllib(recording, tmp_path / "from-s3")
    from_disk = import_rllib(RLLIB, tmp_path / "from-disk")

    # The same rows and files; only dataset.json's generator.args.source (and so the
    # dataset fingerprint) differ.
    assert from_s3 == dataclasses.replace(
        from_disk, out=from_s3.out, fingerprint=from_s3.fingerprint
    )
    assert (from_s3.rows, from_s3.duplicate_rows) == (128, 64)
    assert _parquet_bytes(tmp_path / "from-s3") == _parquet_bytes(tmp_path / "from-disk")
    generator = json.loads((tmp_path / "from-s3" / "dataset.json").read_text())["generator"]
    assert generator["args"]["source"] == recording
    assert sorted(p.name for p in tmp_path.iterdir()) == ["from-disk", "from-s3"]  # copy gone


def test_a_minari_dataset_imports_from_s3_as_from_disk(s3_endpoint, bucket, tmp_path):
    dataset = upload(MINARI, s3_endpoint, bucket, "recordings/minari")
    from_s3 = import_minari(dataset, tmp_path / "from-s3", task_id="cartpole")
    from_disk = import_minari(MINARI, tmp_path / "from-disk", task_id="cartpole")
    assert from_s3 == dataclasses.replace(
        from_disk, out=from_s3.out, fingerprint=from_s3.fingerprint
    )
    assert _parquet_bytes(tmp_path / "from-s3") == _parquet_bytes(tmp_path / "from-disk")


def test_an_import_refusal_names_the_s3_files(s3_endpoint, bucket, tmp_path):
    source = tmp_path / "recording"
    shutil.copytree(RLLIB, source)
    first_run, second_run = _natural(source.glob("*/run-*"))[:2]
    original = _natural(first_run.glob("*.parquet"))[0]
    rewritten = _natural(second_run.glob("*.parquet"))[0]
    table = pq.read_table(rewritten)
    eps_id = table.column("eps_id")[0].as_py()
    index = table.schema.get_field_index("rewards")
    pq.write_table(table.set_column(index, "rewards", pa.array([5.0])), rewritten)
    recording = upload(source, s3_endpoint, bucket, "recordings/conflicting")

    with pytest.raises(DatasetError) as refused:
        import_rllib(recording, tmp_path / "out")
    assert str(refused.value) == (
        f"{recording}/{rewritten.relative_to(source).as_posix()}: episode '{eps_id}' step 0 is "
        "recorded twice with different values in column 'rewards' (first in "
        f"{recording}/{original.relative_to(source).as_posix()}); expected a repeated step to "
        "be an exact copy, as RLlib's recorder rewrites it (remove one of the two recordings)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["recording"]  # nothing written or left


def test_a_missing_recording_is_named(remote, bucket, tmp_path):
    with pytest.raises(DatasetError) as refused:
        import_rllib(f"s3://{bucket}/recordings/nothing/", tmp_path / "out")
    assert str(refused.value) == (
        f"s3://{bucket}/recordings/nothing does not exist; expected a recording directory"
    )
    assert list(tmp_path.iterdir()) == []


def _parquet_bytes(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.glob("*.parquet"))}


def _natural(paths) -> list[Path]:
    return sorted(paths, key=lambda path: natural_key(path.name))


@pytest.mark.timeout(300)
def test_the_data_readme_s3_commands_run(s3_endpoint, tmp_path):
    """The bash block of docs/data-contract.md's "On S3" against the loopback server (the fixture
    sets the AWS variables its exports set); outputs go to ``tmp_path`` instead of /tmp."""
    text = (REPO / "docs" / "data-contract.md").read_text()
    section = text.split("## On S3 {#on-s3}\n", 1)[1].split("\n## ", 1)[0]
    lines = re.findall(r"```bash\n(.*?)```", section, flags=re.DOTALL)[0].splitlines()
    assert [line.split()[1].split("=")[0] for line in lines[:2]] == [
        "AWS_ENDPOINT_URL",
        "AWS_ACCESS_KEY_ID",
    ]
    client = boto3.session.Session().client("s3", endpoint_url=s3_endpoint)
    existing = {bucket["Name"] for bucket in client.list_buckets()["Buckets"]}
    for name in {"datasets", "recordings"} - existing:
        client.create_bucket(Bucket=name)
    upload(LOCAL, s3_endpoint, "datasets", "point_robot/train")
    upload(RLLIB, s3_endpoint, "recordings", "rllib_cartpole")
    for line in lines[2:]:
        words = shlex.split(line.replace("/tmp/", f"{tmp_path}/"), comments=True)
        assert words[0] == "offmeta"
        result = run_in_repo([*OFFMETA, *words[1:]])
        assert result.returncode == 0, (line, result.stderr)
    assert inspect_episodes(tmp_path / "cartpole").num_rows == 128
    compacted = inspect_episodes(tmp_path / "robot-compacted")
    assert (
        compacted.metadata["compacted_from"]["fingerprint"] == inspect_episodes(LOCAL).fingerprint
    )
