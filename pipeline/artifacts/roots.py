"""The one place that turns a store root as written by a user into where the store lives.

A root is a local directory: a path (``artifacts``, ``/srv/artifacts``) or a ``file://`` URI
(``file:///srv/artifacts``, ``file://localhost/srv/artifacts``, percent-encoded as URIs are;
the form ``ArtifactRef.uri`` prints). Anything else with a URI scheme (``s3://bucket/prefix``)
is refused rather than taken as a relative directory named ``s3:``. ``os.PathLike`` roots are
paths by construction and never parsed as URIs.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from pipeline.artifacts.errors import UnsupportedRootError

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_LOCAL_HOSTS = ("", "localhost")
SUPPORTED = "a local directory: a path, or a file:// URI such as file:///srv/artifacts"
"""What a root may be, as error messages say it."""


def local_root(root: str | os.PathLike[str]) -> Path:
    """The absolute directory ``root`` names; UnsupportedRootError naming the root otherwise."""
    if isinstance(root, os.PathLike):
        return Path(root).absolute()
    if not isinstance(root, str):
        raise UnsupportedRootError(
            f"artifact store root must be a string or a path, got {type(root).__name__}"
        )
    if not root.strip():
        raise UnsupportedRootError(f"artifact store root is empty; expected {SUPPORTED}")
    scheme = _SCHEME.match(root)
    if scheme is None:
        return Path(root).absolute()
    if scheme.group(1).lower() != "file":
        # "name:x" may be meant as a directory; "name://x" hardly ever is.
        hint = "" if "://" in root else f" (for a directory of that name, write ./{root})"
        raise UnsupportedRootError(
            f"artifact store root {root!r}: scheme {scheme.group(1)!r} is not supported; "
            f"expected {SUPPORTED}{hint}"
        )
    return _file_uri_path(root)


def _file_uri_path(root: str) -> Path:
    parts = urlsplit(root)
    if parts.query or parts.fragment:
        raise UnsupportedRootError(
            f"artifact store root {root!r}: a file:// URI names a directory and takes no "
            "query or fragment; percent-encode '?' and '#' in directory names (%3F, %23)"
        )
    if parts.netloc.lower() not in _LOCAL_HOSTS:
        raise UnsupportedRootError(
            f"artifact store root {root!r}: host {parts.netloc!r} is not this machine; "
            "expected file:///absolute/path or file://localhost/absolute/path "
            "(mount a shared directory and give its local path)"
        )
    path = unquote(parts.path)
    if not path.startswith("/"):
        raise UnsupportedRootError(
            f"artifact store root {root!r}: a file:// URI needs an absolute path, "
            "e.g. file:///srv/artifacts; write a relative directory as a plain path"
        )
    return Path(path)
