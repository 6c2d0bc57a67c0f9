"""The S3 backend (boto3): conditional writes where the local backend has links and locks.

- ``put_if_absent`` is ``PutObject`` with ``IfNoneMatch='*'``: of two publishers writing
  version 17's manifest, S3 accepts the first and answers the other 412.
- ``swap`` is ``PutObject`` with ``IfMatch=<ETag read>``: an alias moves only if nobody
  moved it since it was read.
- ``claim`` creates a small claim object with ``IfNoneMatch='*'`` and deletes it (with
  ``IfMatch``) when done. A holder that dies leaves its claim behind; it is taken over by
  compare-and-swap once it is older than its lease (half of ``lock_timeout``, measured by
  the server's clock), and a holder refuses to publish once half its lease is spent, so a
  slow holder and the one that took over never both publish.
- Nothing excludes ``gc`` from a publisher on another machine, so ``gc`` only removes
  leftovers older than ``default_gc_age``, and a publisher that reuses an existing blob
  refreshes its age (puts it again if small, else an in-place copy) before any manifest
  refers to it.

The store relies on the server applying a conditional write atomically (Amazon S3 does;
moto's threaded server does not, see tests/pipeline/artifacts/test_s3_server.py). Credentials and
the endpoint come from the standard AWS variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, profiles...).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

from pipeline.artifacts.backends.base import ObjectInfo, Tagged, new_buffer
from pipeline.artifacts.content.params_blob import ChunkReader, Download
from pipeline.artifacts.errors import ArtifactError, LockTimeoutError, StorageError
from pipeline.artifacts.records.roots import S3Root

# Blobs above _MULTIPART_BYTES go up in parallel parts of _PART_BYTES (S3 takes at most
# 5 GiB in one PUT). Below it one PUT is faster: on loopback (moto, 2 cores) 100 MB went up
# in 0.55 s in one request, 0.66 s in 4 parts and 0.77 s in 2 (medians of 3).
_MULTIPART_BYTES = 512 << 20
_PART_BYTES = 64 << 20
_READ_BYTES = 8 << 20  # per read of a GET stream: the tensors complete are hashed meanwhile
_REPUT_BYTES = 1 << 20  # blobs given as bytes up to this size are put again when they exist
_NOT_FOUND = {"NoSuchKey", "NotFound", "404"}
# HTTP dates (Date, Last-Modified) have whole seconds: an age read from them may be up to
# this much more than the true age, so a claim is taken over only this much after its lease.
_CLOCK_RESOLUTION = 1.0


class S3Backend:
    default_gc_age = 3600.0
    writes_before_key = False

    def __init__(
        self,
        root: S3Root,
        *,
        lock_timeout: float,
        client: Any = None,
        multipart_bytes: int = _MULTIPART_BYTES,
        part_bytes: int = _PART_BYTES,
    ) -> None:
        """``multipart_bytes``: blobs larger than this go up in parts of ``part_bytes``
        (at least 5 MiB, S3's smallest part), several at a time."""
        from boto3.s3.transfer import TransferConfig

        self.root = str(root)
        self._root = root
        self._lease = lock_timeout / 2
        self._client = client if client is not None else _client()
        self._transfer = TransferConfig(
            multipart_threshold=multipart_bytes, multipart_chunksize=part_bytes, max_concurrency=8
        )

    def where(self, key: str) -> str:
        return self.uri(key)

    def uri(self, key: str) -> str:
        return f"s3://{self._root.bucket}/{self._root.key(key)}"

    def read(self, key: str) -> memoryview:
        download = self.read_stream(key)
        for _ in download.filled:
            pass
        return download.buffer

    def read_stream(self, key: str) -> Download:
        # One GET stream: on loopback, ranged GETs in parallel threads measured slower
        # (100 MB: 0.11 s in one stream, 0.20 s in 2 ranges, 0.27 s in 4).
        with self._errors("read", key):
            response = self._client.get_object(Bucket=self._root.bucket, Key=self._root.key(key))
        buffer = new_buffer(response["ContentLength"])
        return Download(buffer, self._fill(key, response["Body"], buffer))

    def read_tagged(self, key: str) -> Tagged | None:
        try:
            with self._errors("read", key):
                response = self._client.get_object(
                    Bucket=self._root.bucket, Key=self._root.key(key)
                )
                return Tagged(response["Body"].read(), response["ETag"])
        except FileNotFoundError:
            return None

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self._conditional_put(key, data, IfNoneMatch="*") is not None

    def swap(self, key: str, data: bytes, etag: str | None) -> bool:
        if etag is None:
            return self.put_if_absent(key, data)
        return self._conditional_put(key, data, IfMatch=etag, retry_conflicts=False) is not None

    def put(self, key: str, data: bytes) -> None:
        with self._errors("write", key):
            self._client.put_object(Bucket=self._root.bucket, Key=self._root.key(key), Body=data)

    def store_blob(self, key: str, source: bytes | Path) -> None:
        # A small blob is put again rather than checked: one request instead of two or three
        # (HEAD, then the in-place copy that renews its age); same key, same bytes, and the
        # PUT renews the age too.
        if isinstance(source, bytes) and len(source) <= _REPUT_BYTES:
            self.put(key, source)
        elif not self._refresh(key):
            if isinstance(source, bytes):
                self._upload(key, ChunkReader([memoryview(source)]))
            else:
                with open(source, "rb") as body:
                    self._upload(key, body)

    def store_stream(self, buffers: Sequence[memoryview], key: Callable[[], str]) -> None:
        blob = key()
        if not self._refresh(blob):
            self._upload(blob, ChunkReader(buffers))

    def staging_file(self) -> Path:
        handle, name = tempfile.mkstemp(prefix=f"offmeta-{os.getpid()}-", suffix=".part")
        os.close(handle)
        return Path(name)

    def list(self, prefix: str, start_after: str | None = None) -> list[ObjectInfo]:
        found = []
        base = len(self._root.key(""))
        with self._errors("list", prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._root.bucket,
                Prefix=self._root.key(prefix),
                **({"StartAfter": self._root.key(start_after)} if start_after else {}),
            )
            for page in pages:
                now = _server_time(page)
                for item in page.get("Contents", ()):
                    age = (now - item["LastModified"]).total_seconds()
                    found.append(ObjectInfo(item["Key"][base:], item["Size"], age))
        return sorted(found)

    def children(self, prefix: str) -> list[str]:
        names = []
        # "" lists the folders right under the root itself.
        full = self._root.key(prefix.rstrip("/") + "/") if prefix.strip("/") else self._root.key("")
        with self._errors("list", prefix):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._root.bucket, Prefix=full, Delimiter="/"
            )
            for page in pages:
                folders = page.get("CommonPrefixes", ())
                names += [folder["Prefix"][len(full) :].rstrip("/") for folder in folders]
        return sorted(names)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self._root.bucket, Key=self._root.key(key))

    @contextlib.contextmanager
    def claim(self, key: str, timeout: float) -> Iterator[_Lease]:
        mine = {"token": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
        body = json.dumps({**mine, "lease_s": self._lease}).encode()
        deadline = time.monotonic() + timeout
        pause = 0.01
        while True:
            began = time.monotonic()
            etag = self._conditional_put(key, body, IfNoneMatch="*")
            if etag is None and (held := self._held_claim(key)) is not None:
                held_etag, age, lease = held
                if age >= lease + _CLOCK_RESOLUTION:
                    # Its holder stopped (a live one gives up after half its lease): take
                    # the claim over, unless another waiter just did.
                    etag = self._conditional_put(
                        key, body, IfMatch=held_etag, retry_conflicts=False
                    )
                elif time.monotonic() >= deadline:
                    raise LockTimeoutError(
                        f"gave up after {timeout:g} s waiting for the claim {self.uri(key)}: "
                        f"another publisher has held it for {age:.0f} s (a claim left by a "
                        f"crashed publisher is taken over after {lease + _CLOCK_RESOLUTION:g} s)"
                    )
            if etag is not None:
                break
            time.sleep(pause)
            pause = min(pause * 2, 0.25)
        try:
            yield _Lease(self.uri(key), began, self._lease)
        finally:
            with contextlib.suppress(ArtifactError):
                self._conditional_delete(key, etag)

    def for_writing(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def for_gc(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def remove_staged(self, older_than: float) -> int:
        # Staged files live in each publisher's local temp folder, out of gc's reach.
        return 0

    # ------------------------------------------------------------------- internals

    def _conditional_put(
        self, key: str, data: bytes, *, retry_conflicts: bool = True, **condition: str
    ) -> str | None:
        """The new ETag, or None when the condition failed (412, or 404 for IfMatch)."""
        pause = 0.01
        while True:
            try:
                with self._errors("write", key, passing={"PreconditionFailed", "412", "409"}):
                    response = self._client.put_object(
                        Bucket=self._root.bucket, Key=self._root.key(key), Body=data, **condition
                    )
                return response["ETag"]
            except FileNotFoundError:
                return None
            except _Refused as refused:
                # 409: another conditional write to this key is in flight; its outcome
                # decides ours, so ask again (put-if-absent) or let the caller re-read.
                if refused.status != 409 or not retry_conflicts:
                    return None
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _conditional_delete(self, key: str, etag: str) -> None:
        with (
            contextlib.suppress(_Refused, FileNotFoundError),
            self._errors("delete", key, passing={"PreconditionFailed", "412", "409"}),
        ):
            self._client.delete_object(
                Bucket=self._root.bucket, Key=self._root.key(key), IfMatch=etag
            )

    def _upload(self, key: str, body: io.IOBase) -> None:
        size = body.seek(0, io.SEEK_END)
        body.seek(0)
        with self._errors("write", key):
            if size > self._transfer.multipart_threshold:
                self._client.upload_fileobj(
                    body, self._root.bucket, self._root.key(key), Config=self._transfer
                )
            else:
                self._client.put_object(
                    Bucket=self._root.bucket, Key=self._root.key(key), Body=body
                )

    def _fill(self, key: str, body: Any, buffer: memoryview) -> Iterator[int]:
        position = 0
        try:
            with self._errors("read", key):
                while position < len(buffer) and (
                    chunk := body.read(min(_READ_BYTES, len(buffer) - position))
                ):
                    buffer[position : position + len(chunk)] = chunk
                    position += len(chunk)
                    yield position
        finally:
            body.close()
        if position != len(buffer):
            raise StorageError(f"read {self.uri(key)}: got {position} of {len(buffer)} bytes")

    def _exists(self, key: str) -> bool:
        try:
            with self._errors("read", key):
                self._client.head_object(Bucket=self._root.bucket, Key=self._root.key(key))
        except FileNotFoundError:
            return False
        return True

    def _held_claim(self, key: str) -> tuple[str, float, float] | None:
        """ETag, age and lease (the holder's) of a claim, or None if it was released."""
        try:
            with self._errors("read", key):
                response = self._client.get_object(
                    Bucket=self._root.bucket, Key=self._root.key(key)
                )
                body = response["Body"].read()
        except FileNotFoundError:
            return None
        try:
            lease = float(json.loads(body)["lease_s"])
        except (ValueError, KeyError, TypeError):
            lease = self._lease  # not written by this store: use our own lease
        age = (_server_time(response) - response["LastModified"]).total_seconds()
        return response["ETag"], age, lease

    def _refresh(self, key: str) -> bool:
        """True if the blob exists, after renewing its age so gc keeps it for this publish."""
        if not self._exists(key):
            return False
        source = {"Bucket": self._root.bucket, "Key": self._root.key(key)}
        touched = {"offmeta-reused": datetime.now().astimezone().isoformat()}
        try:
            with self._errors("refresh", key):
                self._client.copy(
                    source,
                    self._root.bucket,
                    self._root.key(key),
                    ExtraArgs={"MetadataDirective": "REPLACE", "Metadata": touched},
                    Config=self._transfer,
                )
        except FileNotFoundError:
            return False  # gc removed it meanwhile: upload it again
        return True

    @contextlib.contextmanager
    def _errors(self, action: str, key: str, passing: set[str] = frozenset()) -> Iterator[None]:
        """Turn boto errors into FileNotFoundError, _Refused or StorageError naming the URI."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            yield
        except (ClientError, S3UploadFailedError) as exc:
            # upload_file wraps the request's ClientError; look at the request's answer.
            cause = exc if isinstance(exc, ClientError) else exc.__context__
            response = cause.response if isinstance(cause, ClientError) else {}
            error = response.get("Error", {})
            code = str(error.get("Code", ""))
            status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
            if code in passing or str(status) in passing:
                raise _Refused(status) from None
            if code in _NOT_FOUND:
                raise FileNotFoundError(f"{self.uri(key)} does not exist") from None
            if code == "NoSuchBucket":
                raise StorageError(
                    f"cannot {action} {self.uri(key)}: the bucket {self._root.bucket!r} does "
                    f"not exist at {self._client.meta.endpoint_url}; create it or fix the "
                    f"store root"
                ) from None
            detail = f"{code} {error.get('Message', '')}".strip() if code else str(exc)
            raise StorageError(f"cannot {action} {self.uri(key)}: {detail}") from None
        except NoCredentialsError:
            raise StorageError(
                f"cannot {action} {self.uri(key)}: no AWS credentials found; set "
                f"AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)"
            ) from None
        except BotoCoreError as exc:
            raise StorageError(
                f"cannot {action} {self.uri(key)} at {self._client.meta.endpoint_url}: {exc}"
            ) from None


class _Refused(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class _Lease:
    """A held claim; ``check`` refuses to go on once half its lease is spent."""

    def __init__(self, uri: str, began: float, lease: float) -> None:
        self._uri, self._began, self._lease = uri, began, lease

    def check(self) -> None:
        held = time.monotonic() - self._began
        if held >= self._lease / 2:
            raise ArtifactError(
                f"held the claim {self._uri} for {held:.1f} s, more than half its "
                f"{self._lease:g} s lease; another publisher of the same idempotency key may "
                f"take it over now, so nothing was published; retry the publish"
            )


def _client() -> Any:
    import boto3
    from botocore.config import Config

    config = Config(retries={"mode": "standard", "max_attempts": 5}, max_pool_connections=16)
    return boto3.session.Session().client("s3", config=config)


def _server_time(response: dict[str, Any]) -> datetime:
    """When the server answered (its ``Date`` header): ages never mix two clocks."""
    return parsedate_to_datetime(response["ResponseMetadata"]["HTTPHeaders"]["date"])
