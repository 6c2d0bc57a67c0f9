"""Everything between bytes on disk and tensors on device, and back to bytes.

Public names are imported lazily, so that importing one corner of the pipeline
(the artifact store, say) does not pay for Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DatasetError": "pipeline.schema",
    "EpisodeSchema": "pipeline.schema",
    "DatasetInfo": "pipeline.dataset",
    "Episodes": "pipeline.dataset",
    "inspect_episodes": "pipeline.dataset",
    "read_episodes": "pipeline.dataset",
    "LearnerStream": "pipeline.streams",
    "StreamStalledError": "pipeline.streams",
    "split_for_learners": "pipeline.streams",
    "collate": "pipeline.batching",
    "finalize": "pipeline.batching",
    "task_samples": "pipeline.tasks",
    "ArtifactRef": "pipeline.artifacts",
    "ArtifactStore": "pipeline.artifacts",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    try:
        module = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}") from None
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
