"""Where everything lives under the store root (the one place that builds paths).

```
ROOT/
  blobs/sha256/ab/abcdef...            content-addressed file contents, read-only
  names/NAME/versions/00000017.json  immutable manifest of version 17
  names/NAME/aliases/latest.json     alias -> version (replaced atomically)
  names/NAME/keys/<sha256(key)>.json idempotency key -> version
  names/NAME/.lock                   flock held while a version is claimed
  tmp/                                   staged files before their atomic rename/link
  .gc.lock                               shared by writers, exclusive for gc
```
Every name is validated before it becomes a path component, so no path built here can
leave the root.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pipeline.artifacts.names import validate_name

_VERSION_FILE = re.compile(r"(\d{8})\.json")


class Layout:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.blobs = root / "blobs" / "sha256"
        self.artifacts = root / "names"
        self.tmp = root / "tmp"
        self.gc_lock = root / ".gc.lock"

    def blob(self, digest: str) -> Path:
        """``sha256:abcd...`` -> ``ROOT/blobs/sha256/ab/abcd...``."""
        hex_digest = digest.removeprefix("sha256:")
        return self.blobs / hex_digest[:2] / hex_digest

    def artifact(self, name: str) -> Path:
        return self.artifacts / validate_name(name)

    def versions(self, name: str) -> Path:
        return self.artifact(name) / "versions"

    def manifest(self, name: str, version: int) -> Path:
        return self.versions(name) / f"{version:08d}.json"

    def alias(self, name: str, alias: str) -> Path:
        return self.artifact(name) / "aliases" / f"{validate_name(alias, 'alias name')}.json"

    def key(self, name: str, idempotency_key: str) -> Path:
        hashed = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()
        return self.artifact(name) / "keys" / f"{hashed}.json"

    def lock(self, name: str) -> Path:
        return self.artifact(name) / ".lock"

    def version_numbers(self, name: str) -> list[int]:
        """Published versions of ``name``, ascending; staged or stray files are ignored."""
        try:
            entries = [entry.name for entry in self.versions(name).iterdir()]
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for e in entries if (m := _VERSION_FILE.fullmatch(e)))
