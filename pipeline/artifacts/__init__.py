"""Versioned artifact store: immutable, numbered versions of parameters with lineage.

>>> store = ArtifactStore("artifacts")  # or "s3://bucket/prefix"       # doctest: +SKIP
>>> ref = store.publish("maml", params, metrics=..., config=..., lineage=...)  # doctest: +SKIP
>>> store.load_params("maml@latest")                                     # doctest: +SKIP

Importing this package imports neither torch, Ray, Prefect, matplotlib nor boto3; they
are loaded where tensors, plots or S3 requests are made.
"""

from pipeline.artifacts.cleanup import GcReport
from pipeline.artifacts.errors import (
    AliasConflictError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
    IntegrityError,
    LockTimeoutError,
    StorageError,
    UnsupportedRootError,
)
from pipeline.artifacts.records.manifest import ArtifactRef, Lineage, Manifest
from pipeline.artifacts.records.roots import S3Root, parse_root
from pipeline.artifacts.store import ArtifactStore

__all__ = [
    "AliasConflictError",
    "ArtifactError",
    "ArtifactNameError",
    "ArtifactNotFoundError",
    "ArtifactRef",
    "ArtifactStore",
    "GcReport",
    "IntegrityError",
    "Lineage",
    "LockTimeoutError",
    "Manifest",
    "S3Root",
    "StorageError",
    "UnsupportedRootError",
    "parse_root",
]
