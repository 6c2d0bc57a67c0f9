"""Walk another tool's recording in a fixed order and fingerprint it as it is read.

The order is the recording order both recorders give their names: directories and files
sorted by name with runs of digits compared as numbers (``run-000000-2`` before
``run-000000-10``, episode folder ``9`` before ``10``). Directories are listed one at a
time, so memory does not grow with the number of files.

The source fingerprint is the sha256 of one ``relative_path\\tsize\\tsha256\\n`` line per
file read, in that order: it changes when any byte of the source does.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa

_DIGITS = re.compile(r"(\d+)")
_WHOLE_FILE_BYTES = 64 << 20
_HASH_CHUNK = 8 << 20


def natural_key(name: str) -> tuple[tuple[int, int | str], ...]:
    """Sort key of ``name`` with runs of digits compared as numbers."""
    return tuple(
        (0, int(part)) if part.isdigit() else (1, part) for part in _DIGITS.split(name) if part
    )


def walk(root: Path, suffixes: tuple[str, ...]) -> Iterator[Path]:
    """Files below ``root`` (or ``root`` itself) ending in one of ``suffixes``, in natural
    order, depth first; names starting with ``.`` or ``_`` are skipped, as the recorders'
    writers and Hive tools use them for temporary and metadata files."""
    if root.is_file():
        yield root
        return
    with os.scandir(root) as listing:
        entries = sorted(
            (e for e in listing if not e.name.startswith((".", "_"))),
            key=lambda e: natural_key(e.name),
        )
    for entry in entries:
        if entry.is_dir():
            yield from walk(Path(entry.path), suffixes)
        elif entry.name.endswith(suffixes):
            yield Path(entry.path)


class SourceFingerprint:
    """sha256 over the files read, in reading order (see module doc)."""

    def __init__(self, root: Path) -> None:
        self._root = os.fspath(root if root.is_dir() else root.parent)
        self._total = hashlib.sha256()

    def read(self, path: str | Path) -> pa.Buffer | Path:
        """Fingerprint ``path`` and return something to parse it from: its bytes when it is
        small (read once), else the path itself (hashed in chunks, parsed afterwards)."""
        path = os.fspath(path)
        size = os.stat(path).st_size
        if size <= _WHOLE_FILE_BYTES:
            with open(path, "rb") as handle:
                data = handle.read()
            self._add(path, len(data), hashlib.sha256(data).hexdigest())
            return pa.py_buffer(data)
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(_HASH_CHUNK):
                digest.update(chunk)
        self._add(path, size, digest.hexdigest())
        return Path(path)

    def hexdigest(self) -> str:
        return self._total.hexdigest()

    def _add(self, path: str, size: int, digest: str) -> None:
        # String operations: pathlib's relative_to costs more than hashing a small file.
        relative = (
            os.path.relpath(path, self._root) if os.sep != "/" else path[len(self._root) + 1 :]
        )
        self._total.update(f"{relative}\t{size}\t{digest}\n".encode())
