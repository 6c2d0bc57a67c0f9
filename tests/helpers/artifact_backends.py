"""The artifact-store tests run against both backends: a local directory and S3.

``Storage`` reaches the stored objects directly (the filesystem, or boto3 against the
loopback server), not through the store, so tests can look at and damage what is there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.artifacts import ArtifactRef, ArtifactStore

BACKENDS = ["local", "s3"]


@dataclass
class Storage:
    kind: str
    root: str
    """What the store is opened with: a directory or ``s3://bucket/prefix``."""

    def store(self, **options: Any) -> ArtifactStore:
        if self.kind == "local":
            options.setdefault("durable", False)
        return ArtifactStore(self.root, **options)

    def sibling(self, name: str) -> Storage:
        """Another, empty store next to this one (same bucket)."""
        return Storage(self.kind, self.root.rsplit("/", 1)[0] + "/" + name)

    def location(self, key: str) -> str:
        """How the store names an object in messages: a path or an ``s3://`` URI."""
        return str(Path(self.root, key)) if self.kind == "local" else f"{self.root}/{key}"

    def uri(self, key: str) -> str:
        return Path(self.root, key).as_uri() if self.kind == "local" else f"{self.root}/{key}"

    def listed(self, prefix: str = "") -> list[str]:
        """Every stored object under ``prefix`` (locks and staging folders left out)."""
        if self.kind == "local":
            base = Path(self.root)
            found = [
                path.relative_to(base).as_posix()
                for path in base.rglob("*")
                if path.is_file() and not path.name.startswith(".")
            ]
            return sorted(k for k in found if k.startswith(prefix) and not k.startswith("tmp/"))
        bucket, root_prefix = self._bucket_and_prefix()
        pages = (
            _client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=bucket, Prefix=f"{root_prefix}/{prefix}")
        )
        skip = len(root_prefix) + 1
        return sorted(item["Key"][skip:] for page in pages for item in page.get("Contents", ()))

    def read(self, key: str) -> bytes:
        if self.kind == "local":
            return Path(self.root, key).read_bytes()
        bucket, root_prefix = self._bucket_and_prefix()
        return _client().get_object(Bucket=bucket, Key=f"{root_prefix}/{key}")["Body"].read()

    def write(self, key: str, data: bytes) -> None:
        if self.kind == "local":
            path = Path(self.root, key)
            if path.exists():
                path.chmod(0o644)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        bucket, root_prefix = self._bucket_and_prefix()
        _client().put_object(Bucket=bucket, Key=f"{root_prefix}/{key}", Body=data)

    def delete(self, key: str) -> None:
        if self.kind == "local":
            os.unlink(Path(self.root, key))
            return
        bucket, root_prefix = self._bucket_and_prefix()
        _client().delete_object(Bucket=bucket, Key=f"{root_prefix}/{key}")

    def _bucket_and_prefix(self) -> tuple[str, str]:
        bucket, prefix = self.root.removeprefix("s3://").split("/", 1)
        return bucket, prefix


def blob_key(digest: str) -> str:
    return f"blobs/sha256/{digest[7:9]}/{digest[7:]}"


def filled_params(value: float) -> dict[str, dict[str, torch.Tensor]]:
    """Parameters whose values say which publish they came from."""
    return {"default_policy": {"w": torch.full((4,), value), "b": torch.zeros(2)}}


def publish_filled(store: ArtifactStore, value: float, **options: Any) -> ArtifactRef:
    """Publish ``filled_params(value)`` as a version of ``model`` (loss ``value``)."""
    return store.publish(
        "model", filled_params(value), metrics={"loss": value}, config={}, lineage={}, **options
    )


def make_storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """For a fixture parametrised with ``BACKENDS``."""
    if request.param == "local":
        return Storage("local", str(tmp_path / "store"))
    return Storage("s3", request.getfixturevalue("s3_root"))


def _client() -> Any:
    import boto3

    return boto3.session.Session().client("s3")
