"""Where a store lives: the one place that reads a store root string.

Accepted: a directory path (``artifacts``, ``/srv/models``), a ``file://`` URI of one (what
the store prints as version URIs), and ``s3://bucket[/prefix]`` for object storage. Anything
else with a scheme (``gs://``, ``http://``) is refused here, before a byte is written, rather
than becoming a local folder named ``gs:``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pipeline.artifacts.errors import UnsupportedRootError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
# S3 bucket naming rules (general purpose buckets): 3-63 lowercase letters, digits, '.', '-'.
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_SUPPORTED = "a directory path, a file:// URI or s3://bucket/prefix"


@dataclass(frozen=True)
class S3Root:
    """``s3://bucket/prefix``: every key of the store starts with ``prefix/`` (if any)."""

    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}" if self.prefix else relative


def parse_root(
    root: str | os.PathLike[str], *, what: str = "artifact store root", writer: str = "the store"
) -> Path | S3Root:
    """The absolute directory of a local store, or the bucket and prefix of an S3 store.

    Raises UnsupportedRootError naming the root, what was wrong and what is accepted; the
    messages call the root ``what`` and the one who writes there ``writer`` (run storage
    reads ``training.checkpoint_dir`` with the same rules).
    """
    if isinstance(root, os.PathLike):
        return Path(root).absolute()
    if not isinstance(root, str) or not root:
        raise UnsupportedRootError(
            f"{what} must be a non-empty string or path, got {root!r}; expected {_SUPPORTED}"
        )
    match = _SCHEME.match(root)
    if match is None:
        return Path(root).absolute()
    scheme = match.group(1).lower()
    if scheme == "file":
        return _file_root(root, what)
    if scheme == "s3":
        return _s3_root(root, what)
    raise UnsupportedRootError(
        f"{what} {root!r} has the scheme '{scheme}://', which {writer} cannot "
        f"write to; expected {_SUPPORTED}"
    )


def _file_root(root: str, what: str) -> Path:
    parts = urlsplit(root)
    if parts.netloc not in ("", "localhost"):
        raise UnsupportedRootError(
            f"{what} {root!r} names the host {parts.netloc!r}; a file:// root "
            f"must be local (file:///absolute/path)"
        )
    if parts.query or parts.fragment or not parts.path:
        raise UnsupportedRootError(
            f"{what} {root!r} is not a plain file:// URI; expected file:///absolute/path"
        )
    return Path(unquote(parts.path)).absolute()


def _s3_root(root: str, what: str) -> S3Root:
    rest = root[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise UnsupportedRootError(
            f"{what} {root!r} names the bucket {bucket!r}, which is not a valid "
            f"S3 bucket name (3-63 lowercase letters, digits, '.' and '-'); "
            f"expected s3://bucket/prefix"
        )
    prefix = prefix.strip("/")
    segments = prefix.split("/") if prefix else []
    if any(segment in ("", ".", "..") for segment in segments) or any(
        ord(char) < 32 for char in prefix
    ):
        raise UnsupportedRootError(
            f"{what} {root!r} has the prefix {prefix!r}, with an empty, '.' or "
            f"'..' segment or a control character; expected s3://bucket/some/prefix"
        )
    return S3Root(bucket, prefix)
