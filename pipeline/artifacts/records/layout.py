"""Where everything lives under the store root: the one place that builds keys.

```
ROOT/                                    a directory, or s3://bucket/prefix
  blobs/sha256/ab/abcdef...              content-addressed file contents, never rewritten
  names/NAME/versions/00000017.json      immutable manifest of version 17
  names/NAME/aliases/latest.json         alias -> version (compare-and-swap)
  names/NAME/keys/<sha256(key)>.json     idempotency key -> version
  names/NAME/keys/<sha256(key)>.claim    held while a publish with that key is in flight
```
A local root also has ``tmp/`` (files staged before their atomic link or rename), the
``.lock`` files that alias swaps hold, and ``.gc.lock`` (shared by writers, exclusive for
gc). Every name is validated before it becomes part of a key, so no key built here can
leave the root. Keys are relative and ``/``-separated; backends map them to paths or
object keys.
"""

from __future__ import annotations

import hashlib
import re

from pipeline.artifacts.records.names import validate_name

BLOBS = "blobs/sha256"
NAMES = "names"
_VERSION_FILE = re.compile(r"(\d{8})\.json")


def blob(digest: str) -> str:
    """``sha256:abcd...`` -> ``blobs/sha256/ab/abcd...``."""
    hex_digest = digest.removeprefix("sha256:")
    return f"{BLOBS}/{hex_digest[:2]}/{hex_digest}"


def digest_of_blob(key: str) -> str:
    return "sha256:" + key.rsplit("/", 1)[-1]


def artifact(name: str) -> str:
    return f"{NAMES}/{validate_name(name)}"


def versions(name: str) -> str:
    return f"{artifact(name)}/versions/"


def manifest(name: str, version: int) -> str:
    return f"{versions(name)}{version:08d}.json"


def version_of(key: str) -> int | None:
    """The version number a manifest key names, or None for any other key."""
    match = _VERSION_FILE.fullmatch(key.rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def aliases(name: str) -> str:
    return f"{artifact(name)}/aliases/"


def alias(name: str, alias_name: str) -> str:
    return f"{aliases(name)}{validate_name(alias_name, 'alias name')}.json"


def keys(name: str) -> str:
    return f"{artifact(name)}/keys/"


def key(name: str, idempotency_key: str) -> str:
    return f"{keys(name)}{_hashed(idempotency_key)}.json"


def claim(name: str, idempotency_key: str) -> str:
    return f"{keys(name)}{_hashed(idempotency_key)}.claim"


def _hashed(idempotency_key: str) -> str:
    return hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()
