"""``gc``: remove what interrupted publishes leave behind.

A publisher killed before its manifest is linked leaves staged files in ``ROOT/tmp``,
blobs no manifest refers to, and possibly an idempotency record pointing at a version
that never appeared. None of them is visible to readers, so they are harmless, only
wasted space. ``gc`` holds the root's gc lock exclusively (every writer holds it
shared), so no publish is in flight while it decides what is garbage.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pipeline.artifacts import fsio
from pipeline.artifacts.errors import ArtifactNameError
from pipeline.artifacts.layout import Layout
from pipeline.artifacts.manifest import KeyRecord, Manifest
from pipeline.artifacts.names import validate_name
from pipeline.artifacts.reader import read_manifest


@dataclass(frozen=True)
class GcReport:
    """What ``ArtifactStore.gc`` removed."""

    temp_files: int
    blobs: int
    freed_bytes: int
    key_records: int


def collect_garbage(layout: Layout, *, timeout: float) -> GcReport:
    """Remove staged files, unreferenced blobs and dangling idempotency records.

    Every manifest is read first; if one cannot be read the store is left untouched
    (IntegrityError), because its blobs would otherwise look unreferenced.
    """
    if not layout.root.exists():
        return GcReport(0, 0, 0, 0)
    with fsio.file_lock(layout.gc_lock, timeout=timeout):
        referenced: set[str] = set()
        dangling_keys = []
        for name in _names(layout):
            manifests = {v: read_manifest(layout, name, v) for v in layout.version_numbers(name)}
            for manifest in manifests.values():
                referenced.update(entry.digest for entry in manifest.files.values())
            dangling_keys.extend(_dangling_keys(layout, name, manifests))
        temp_files = _remove_all(layout.tmp.glob("*"))
        blobs = freed = 0
        for path in layout.blobs.glob("*/*"):
            if f"sha256:{path.name}" not in referenced and path.is_file():
                freed += path.stat().st_size
                blobs += _remove_all([path])
        return GcReport(temp_files, blobs, freed, _remove_all(dangling_keys))


def _names(layout: Layout) -> list[str]:
    names = []
    with contextlib.suppress(FileNotFoundError):
        for entry in layout.artifacts.iterdir():
            with contextlib.suppress(ArtifactNameError):
                names.append(validate_name(entry.name))
    return sorted(names)


def _dangling_keys(layout: Layout, name: str, manifests: dict[int, Manifest]) -> list[Path]:
    dangling = []
    for path in (layout.artifact(name) / "keys").glob("*.json"):
        try:
            record = KeyRecord.model_validate_json(path.read_bytes())
        except ValueError:
            dangling.append(path)
            continue
        manifest = manifests.get(record.version)
        if manifest is None or manifest.idempotency_key != record.idempotency_key:
            dangling.append(path)
    return dangling


def _remove_all(paths: Iterable[Path]) -> int:
    removed = 0
    for path in paths:
        if os.path.isfile(path):
            fsio.remove_quietly(path)
            removed += 1
    return removed
