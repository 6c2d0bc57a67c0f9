"""Open the backend for a store root: a local directory or an S3 bucket."""

from __future__ import annotations

import os
from typing import Any

from pipeline.artifacts.backends.base import Backend
from pipeline.artifacts.errors import ArtifactError
from pipeline.artifacts.records.roots import S3Root, parse_root


def open_backend(
    root: str | os.PathLike[str], *, durable: bool, lock_timeout: float, client: Any = None
) -> Backend:
    """The backend for a store root (see ``pipeline.artifacts.records.roots.parse_root``).

    ``client`` is a boto3 S3 client to use instead of one built from the standard AWS
    environment variables; it is refused for a local root.
    """
    parsed = parse_root(root)
    if isinstance(parsed, S3Root):
        from pipeline.artifacts.backends.s3 import S3Backend

        return S3Backend(parsed, lock_timeout=lock_timeout, client=client)
    if client is not None:
        raise ArtifactError(f"client= is for s3:// stores; {str(root)!r} is a local directory")
    from pipeline.artifacts.backends.local import LocalBackend

    return LocalBackend(parsed, durable=durable, lock_timeout=lock_timeout)
