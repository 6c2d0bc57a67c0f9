"""Meta-batches: `{"support": Batch, "query": Batch}` with a leading task dimension.

Support tensors are shaped `[M, K, ...]` and query tensors `[M, Q, ...]` (M tasks). The
meta-learner checks a meta-batch once at the boundary, then vmaps over the task dimension
or slices one task at a time.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from learners.params import Batch

MetaBatch = Mapping[str, Batch]
"""`{"support": Batch, "query": Batch}`, tensors shaped `[tasks, rows, ...]`."""


def task_slice(batch: Batch, index: int) -> dict[str, dict[str, Tensor]]:
    """Task `index` of every tensor in a batch (the leading dimension removed)."""
    return {mid: {col: t[index] for col, t in columns.items()} for mid, columns in batch.items()}


def check_meta_batch(meta_batch: MetaBatch, trained: list[str]) -> tuple[Batch, Batch, int]:
    """(support, query, number of tasks) after checking structure, types and task counts."""
    missing = [part for part in ("support", "query") if part not in meta_batch]
    if missing:
        raise ValueError(f"a meta-batch needs 'support' and 'query', it has {sorted(meta_batch)}")
    support, query = meta_batch["support"], meta_batch["query"]
    if sorted(support) != sorted(query):
        raise ValueError(
            f"support modules {sorted(support)} differ from query modules {sorted(query)}"
        )
    if not any(m in support for m in trained):
        raise ValueError(
            f"the meta-batch holds modules {sorted(support)}, none of the trained {trained}"
        )
    # Runs before every meta-step: the messages are built only when a check fails.
    tasks = set()
    for batch in (support, query):
        for columns in batch.values():
            for tensor in columns.values():
                if not isinstance(tensor, Tensor) or tensor.dim() < 2:
                    _refuse_tensors(support, query)
                tasks.add(tensor.shape[0])
    if len(tasks) != 1:
        _refuse_tensors(support, query)
    return support, query, tasks.pop()


def _refuse_tensors(support: Batch, query: Batch) -> None:
    """Raise for the first tensor not shaped [tasks, rows, ...], else for differing task counts."""
    sizes = {}
    for part, batch in (("support", support), ("query", query)):
        for module_id, columns in batch.items():
            for column, tensor in columns.items():
                where = f"{part}[{module_id!r}][{column!r}]"
                if not isinstance(tensor, Tensor) or tensor.dim() < 2:
                    found = tuple(tensor.shape) if isinstance(tensor, Tensor) else type(tensor)
                    raise TypeError(
                        f"{where} must be a tensor shaped [tasks, rows, ...], got {found}"
                    )
                sizes[where] = tensor.shape[0]
    raise ValueError(f"every tensor needs the same number of tasks (leading dim), got {sizes}")
