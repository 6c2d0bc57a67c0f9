"""The one place an ``s3://`` dataset's filesystem is built: ``s3_filesystem``.

Endpoint, region and credentials come from the standard AWS variables (``AWS_ENDPOINT_URL``
or ``AWS_ENDPOINT_URL_S3``, ``AWS_REGION`` or ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``) and are passed to ``pyarrow.fs.S3FileSystem``
explicitly: the filesystem is pickled into Ray's read tasks, and worker processes started
before the variables were set (or on other machines) read with the same endpoint and keys.
Without ``AWS_ACCESS_KEY_ID`` the SDK's own chain (profiles, instance roles) applies where
the filesystem is used.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from pipeline.contract.schema import DatasetError

SCHEME = "s3://"


def s3_filesystem(uri: str) -> tuple[pafs.S3FileSystem, str]:
    """The S3 filesystem for ``uri`` (``s3://bucket/key``) and the path on it (``bucket/key``).

    The bucket is checked: raises ``DatasetError`` naming ``uri`` when the endpoint cannot
    be reached or the bucket does not exist.
    """
    path = uri[len(SCHEME) :].rstrip("/")
    bucket = path.split("/", 1)[0]
    if not bucket:
        raise DatasetError(f"{uri!r} names no bucket; expected s3://BUCKET/PREFIX")
    endpoint = _endpoint()
    options: dict[str, str] = {}
    if endpoint:
        options["endpoint_override"] = endpoint
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    key_id = os.environ.get("AWS_ACCESS_KEY_ID")
    if key_id:
        secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
        if not secret:
            raise DatasetError(
                f"cannot open {uri!r}: AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is "
                "not; expected both (or neither, to use the AWS SDK's profiles and roles)"
            )
        options.update(access_key=key_id, secret_key=secret)
        if token := os.environ.get("AWS_SESSION_TOKEN"):
            options["session_token"] = token
    where = endpoint or "Amazon S3"
    try:
        if not region and not endpoint:
            # As pyarrow's from_uri does: Amazon S3 answers only in the bucket's region.
            options["region"] = pafs.resolve_s3_region(bucket)
        filesystem = pafs.S3FileSystem(**options)
        found = filesystem.get_file_info(bucket).type
    except OSError as exc:
        raise DatasetError(_unreadable(uri, where, exc)) from None
    if found == pafs.FileType.NotFound:
        raise DatasetError(
            f"cannot open {uri!r}: bucket {bucket!r} does not exist at {where}; expected an "
            "existing bucket (check the name, and AWS_ENDPOINT_URL for an S3-compatible server)"
        )
    return filesystem, path


def s3_error(uri: str, exc: OSError) -> DatasetError:
    """``exc``, raised by an S3 request made for ``uri``, as a ``DatasetError`` naming it."""
    return DatasetError(_unreadable(uri, _endpoint() or "Amazon S3", exc))


def _endpoint() -> str | None:
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


def _unreadable(uri: str, where: str, exc: OSError) -> str:
    reason = " ".join(str(exc).split())
    if "NETWORK_CONNECTION" in reason or "Could not connect" in reason:
        # The SDK's text carries timings that change from run to run; the cause does not.
        return (
            f"cannot open {uri!r}: no S3 endpoint answers at {where}; expected a reachable "
            "S3 server (check AWS_ENDPOINT_URL, or unset it for Amazon S3)"
        )
    return f"cannot open {uri!r} at {where}: {reason}"
