"""Versioned artifact store: immutable, numbered versions of parameters with lineage.

>>> store = ArtifactStore("artifacts")                                   # doctest: +SKIP
>>> ref = store.publish("maml", params, metrics=..., config=..., lineage=...)  # doctest: +SKIP
>>> store.load_params("maml@latest")                                     # doctest: +SKIP

Importing this package imports neither torch, Ray, Prefect nor matplotlib; they are
loaded where tensors or plots are made.
"""

from pipeline.artifacts.cleanup import GcReport
from pipeline.artifacts.errors import (
    AliasConflictError,
    ArtifactError,
    ArtifactNameError,
    ArtifactNotFoundError,
    IntegrityError,
    LockTimeoutError,
    UnsupportedRootError,
)
from pipeline.artifacts.manifest import ArtifactRef, Lineage, Manifest
from pipeline.artifacts.roots import local_root
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
    "UnsupportedRootError",
    "local_root",
]
