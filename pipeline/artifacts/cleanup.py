"""``gc``: remove what interrupted publishes leave behind.

A publisher killed before its manifest exists leaves blobs no manifest refers to, an
idempotency record pointing at a version that never appeared and, in a local store,
staged files in ``ROOT/tmp``. None of them is visible to readers, so they are harmless,
only wasted space.

What keeps ``gc`` from removing what a publish still in flight is about to refer to: in a
local store, ``gc`` holds the root's gc lock exclusively (every writer holds it shared);
on S3, where a publisher on another machine cannot be excluded, only leftovers older
than ``older_than`` are removed, blobs are listed *before* manifests are read (a blob
written after the listing is not a candidate), and a publisher that reuses an existing
blob renews its age first. What remains: a publish slower than ``older_than`` from its
first blob to its manifest, or one that reuses an old unreferenced blob between gc's
listing and its delete; ``verify`` names a blob lost that way.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from pipeline.artifacts.backends.base import Backend, ObjectInfo
from pipeline.artifacts.reader import read_manifest, version_numbers
from pipeline.artifacts.records import layout
from pipeline.artifacts.records.manifest import KeyRecord, Manifest
from pipeline.artifacts.records.names import validate_name


@dataclass(frozen=True)
class GcReport:
    """What ``ArtifactStore.gc`` removed."""

    temp_files: int
    blobs: int
    freed_bytes: int
    key_records: int


def collect_garbage(backend: Backend, *, older_than: float) -> GcReport:
    """Remove staged files, unreferenced blobs and dangling idempotency records.

    Every manifest is read first; if one cannot be read the store is left untouched
    (IntegrityError), because its blobs would otherwise look unreferenced.
    """
    with backend.for_gc():
        blobs = backend.list(layout.BLOBS)
        referenced: set[str] = set()
        dangling: list[ObjectInfo] = []
        for name in _names(backend):
            manifests = {v: read_manifest(backend, name, v) for v in version_numbers(backend, name)}
            for manifest in manifests.values():
                referenced.update(entry.digest for entry in manifest.files.values())
            dangling += _dangling_keys(backend, name, manifests)
        temp_files = backend.remove_staged(older_than)
        removed = [
            blob
            for blob in blobs
            if blob.age >= older_than and layout.digest_of_blob(blob.key) not in referenced
        ]
        stale_keys = [record for record in dangling if record.age >= older_than]
        for info in removed + stale_keys:
            backend.delete(info.key)
        return GcReport(
            temp_files=temp_files,
            blobs=len(removed),
            freed_bytes=sum(blob.size for blob in removed),
            key_records=len(stale_keys),
        )


def _names(backend: Backend) -> list[str]:
    names = []
    for entry in backend.children(layout.NAMES):
        try:
            names.append(validate_name(entry))
        except ValueError:
            continue
    return names


def _dangling_keys(backend: Backend, name: str, manifests: dict[int, Manifest]) -> list[ObjectInfo]:
    dangling = []
    for info in backend.list(layout.keys(name)):
        if not info.key.endswith(".json"):
            continue  # a claim: released by its holder, or taken over by the next one
        try:
            record = KeyRecord.model_validate_json(bytes(backend.read(info.key)))
        except (ValidationError, FileNotFoundError):
            dangling.append(info)
            continue
        manifest = manifests.get(record.version)
        if manifest is None or manifest.idempotency_key != record.idempotency_key:
            dangling.append(info)
    return dangling
