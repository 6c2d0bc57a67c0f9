"""Everything between bytes on disk and tensors on device, and back to bytes.

Public names are imported lazily, so that importing one corner of the pipeline
(the artifact store, say) does not pay for Ray.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "DatasetError": "pipeline.contract.schema",
    "EpisodeSchema": "pipeline.contract.schema",
    "DatasetInfo": "pipeline.reads.episodes",
    "Episodes": "pipeline.reads.episodes",
    "inspect_episodes": "pipeline.reads.episodes",
    "read_episodes": "pipeline.reads.episodes",
    "LearnerStream": "pipeline.streams.learner_stream",
    "RowStream": "pipeline.rows.options",
    "TaskStream": "pipeline.tasks.options",
    "StreamStalledError": "pipeline.streams.learner_stream",
    "split_for_learners": "pipeline.streams.learner_stream",
    "collate": "pipeline.streams.collate",
    "finalize": "pipeline.streams.collate",
    "task_samples": "pipeline.tasks.samples",
    "ArtifactRef": "pipeline.artifacts",
    "ArtifactStore": "pipeline.artifacts",
    "load_learner": "pipeline.consumer",
    "predict": "pipeline.consumer",
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
