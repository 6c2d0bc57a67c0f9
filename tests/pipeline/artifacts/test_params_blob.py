"""Params blobs as streams: the safetensors layout written from the tensors' memory, the
body read for uploads, hashing while a download arrives, multipart uploads on S3."""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator

import boto3
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from pipeline.artifacts import IntegrityError, StorageError
from pipeline.artifacts.backends.s3 import S3Backend
from pipeline.artifacts.content.digest import flatten_params, params_digest, read_params
from pipeline.artifacts.content.params_blob import (
    ChunkReader,
    Download,
    EncodedStream,
    TensorHashes,
    encode_params,
    receive_params,
)
from pipeline.artifacts.records.roots import parse_root
from tests.helpers.artifact_backends import Storage, blob_key

pytestmark = pytest.mark.timeout(60)


def _mixed() -> dict[str, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return {
        "m": {
            "f16": torch.randn(3, generator=generator).half(),
            "flag": torch.tensor([True, False, True]),
            "f64": torch.randn(5, dtype=torch.float64, generator=generator),
            "bf16": torch.randn(7, generator=generator).bfloat16(),
            "i8": torch.arange(5, dtype=torch.int8),
            "f32": torch.randn(2, 3, generator=generator),
            "scalar": torch.tensor(3.0),
            "empty": torch.zeros(0, 4),
        },
        "empty_module": {},
    }


def _encoded(params: dict[str, dict[str, torch.Tensor]]) -> tuple[EncodedStream, str]:
    stream = encode_params(*flatten_params(params))
    with TensorHashes(stream.size, beside_writer=False) as hashes:
        for key, view in zip(stream.keys, stream.chunks[1:], strict=True):
            hashes.add(key, view)
        return stream, stream.encoded(hashes.digests()).digest


def _pieces(data: bytes, step: int) -> Download:
    buffer = memoryview(bytearray(len(data)))

    def fill() -> Iterator[int]:
        for start in range(0, len(data), step):
            end = min(start + step, len(data))
            buffer[start:end] = data[start:end]
            yield end

    return Download(buffer, fill())


def test_encoded_params_are_a_safetensors_file_with_every_tensor_aligned(tmp_path):
    params = _mixed()
    stream, digest = _encoded(params)
    path = tmp_path / "params.safetensors"
    path.write_bytes(b"".join(stream.chunks))
    assert stream.size == path.stat().st_size

    loaded = load_file(str(path))
    assert loaded.keys() == {f"m/{name}" for name in params["m"]}
    for name, tensor in params["m"].items():
        assert loaded[f"m/{name}"].dtype == tensor.dtype
        assert torch.equal(loaded[f"m/{name}"], tensor)
    with safe_open(str(path), "pt") as opened:
        assert opened.metadata() == {"format": "pt", "offmeta.modules": '["empty_module", "m"]'}
    data = path.read_bytes()
    header_length = int.from_bytes(data[:8], "little")
    assert header_length % 8 == 0
    header = json.loads(data[8 : 8 + header_length])
    for key, spec in header.items():
        if key != "__metadata__":
            size = loaded[key].element_size()
            assert (8 + header_length + spec["data_offsets"][0]) % size == 0, key
    # The same digest whoever wrote the file: the reading side agrees, and so does a file
    # that safetensors itself laid out.
    assert params_digest(read_params(path))[0] == digest
    other = tmp_path / "by-safetensors.safetensors"
    save_file(
        loaded, str(other), metadata={"format": "pt", "offmeta.modules": '["empty_module", "m"]'}
    )
    assert params_digest(read_params(other))[0] == digest


def test_chunk_reader_reads_across_buffers_and_seeks_back():
    parts = [b"header--", b"", b"abc", b"0123456789", b"", b"z"]
    joined = b"".join(parts)
    reader = ChunkReader([memoryview(part) for part in parts])
    assert reader.size == len(joined)
    assert reader.read(5) == joined[:5]
    assert reader.read(7) == joined[5:12]
    assert reader.seek(-3, io.SEEK_END) == len(joined) - 3
    assert reader.read() == joined[-3:]
    assert reader.read(4) == b""
    assert reader.seek(2) == 2
    assert reader.read() == joined[2:]
    reader.seek(0)
    assert b"".join(iter(lambda: reader.read(4), b"")) == joined
    with pytest.raises(ValueError, match=r"^cannot seek to -1, before the start$"):
        reader.seek(-1)


def test_a_download_arriving_in_pieces_gives_the_whole_file_digest():
    stream, digest = _encoded(_mixed())
    data = b"".join(stream.chunks)
    for step in (1, 7, 100, len(data)):
        parsed, found, tensors = receive_params(_pieces(data, step), "blob")
        assert found == digest
        assert bytes(parsed.buffer) == data
        assert set(tensors) == {f"m/{name}" for name in _mixed()["m"]}


def test_a_short_or_broken_download_is_named_like_a_broken_file():
    header = b'{"m/w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}'
    claims_more = (100).to_bytes(8, "little") + header[:20]
    with pytest.raises(IntegrityError) as raised:
        receive_params(_pieces(claims_more, 3), "s3://b/blob")
    assert raised.value.problems == (
        "s3://b/blob is not a readable safetensors file: the header claims 100 bytes but the "
        "file has 20",
    )

    def failing() -> Iterator[int]:
        yield 4
        raise StorageError("read s3://b/blob: got 4 of 64 bytes")

    with pytest.raises(StorageError, match=r"^read s3://b/blob: got 4 of 64 bytes$"):
        receive_params(Download(memoryview(bytearray(64)), failing()), "s3://b/blob")


def test_a_blob_larger_than_the_part_size_goes_up_in_parts_and_reads_back_verified(s3_root):
    mib = 1 << 20
    backend = S3Backend(
        parse_root(s3_root), lock_timeout=10, multipart_bytes=5 * mib, part_bytes=5 * mib
    )
    generator = torch.Generator().manual_seed(0)
    params = {"m": {"w": torch.randn(3 * mib, generator=generator)}}  # 12 MiB
    stream, digest = _encoded(params)
    backend.store_stream(stream.chunks, lambda: blob_key(digest))

    bucket, prefix = s3_root.removeprefix("s3://").split("/", 1)
    head = (
        boto3.session.Session()
        .client("s3")
        .head_object(Bucket=bucket, Key=f"{prefix}/{blob_key(digest)}")
    )
    assert head["ContentLength"] == stream.size
    assert head["ETag"].strip('"').endswith("-3")  # 5 + 5 + 2 MiB: a multipart upload
    parsed, found, _ = receive_params(backend.read_stream(blob_key(digest)), "blob")
    assert found == digest
    assert bytes(parsed.buffer) == b"".join(stream.chunks)


@pytest.mark.timeout(60)
def test_a_large_corrupted_blob_read_in_pieces_is_refused_naming_the_tensor(storage):
    store = storage.store()
    generator = torch.Generator().manual_seed(1)
    params = {f"m{i}": {"w": torch.randn(1 << 20, generator=generator)} for i in range(5)}
    ref = store.publish("big", params, metrics={}, config={}, lineage={})  # 20 MiB
    assert torch.equal(store.load_params(ref)["m2"]["w"], params["m2"]["w"])
    blob = blob_key(ref.digest)
    data = bytearray(storage.read(blob))
    data[len(data) // 2] ^= 0xFF  # inside m2/w, the middle tensor
    storage.write(blob, bytes(data))

    with pytest.raises(IntegrityError) as raised:
        store.load_params(ref)
    (problem,) = raised.value.problems
    assert re.fullmatch(
        rf"big:1 file 'params.safetensors' \(blob {re.escape(storage.location(blob))}\) is "
        rf"corrupt: expected digest {ref.digest}, found sha256:[0-9a-f]{{64}}; "
        rf"tensors that differ: 'm2/w'",
        problem,
    ), problem


def test_a_reused_small_blob_on_s3_is_put_again_renewing_its_age(s3_root):
    storage = Storage("s3", s3_root)
    store = storage.store()
    params = {"m": {"w": torch.ones(3)}}
    first = store.publish("model", params, metrics={"loss": 1.0}, config={}, lineage={})
    metrics_blob = blob_key(store.get("model").files["metrics.json"].digest)
    bucket, prefix = s3_root.removeprefix("s3://").split("/", 1)
    client = boto3.session.Session().client("s3")
    before = client.head_object(Bucket=bucket, Key=f"{prefix}/{metrics_blob}")["LastModified"]
    time.sleep(1.1)  # S3 dates have whole seconds
    again = store.publish("model", params, metrics={"loss": 1.0}, config={}, lineage={})
    assert (again.version, again.digest) == (2, first.digest)
    digests = {store.get("model", version=v).files["metrics.json"].digest for v in (1, 2)}
    assert len(digests) == 1
    after = client.head_object(Bucket=bucket, Key=f"{prefix}/{metrics_blob}")
    assert after["LastModified"] > before
    assert "offmeta-reused" not in after["Metadata"]  # put again, not copied in place
    store.verify(again)
