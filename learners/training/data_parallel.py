"""Keeping data-parallel learners in step: averaged meta-gradients, merged metrics, and a
check that the meta-parameters stayed identical on every worker.

Every function here is a collective over the default ``torch.distributed`` process group
(Ray Train sets it up: gloo on CPU, nccl on GPU): every worker must call it at the same
point of its loop, which the training loop guarantees by running the same number of
meta-steps, log points and checkpoints on each worker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from learners.meta.learner import MetaGradients, MetaLearner
from learners.meta.meta_batch import MetaBatch
from learners.metrics import MetricsLogger, merge_reduced

AllReduce = Callable[[Tensor], None]
"""Sums a tensor over all workers, in place (``torch.distributed.all_reduce``)."""


class ParametersDivergedError(RuntimeError):
    """The meta-parameters differ between workers: the averaged updates no longer match."""


def pack_gradients(grads: MetaGradients, num_tasks: int) -> Tensor:
    """One flat buffer ``[num_tasks * g_1, ..., num_tasks * g_n, num_tasks]``.

    Summing these buffers over workers and dividing by the last entry gives the mean
    meta-gradient over every task of every worker, also when workers had different
    numbers of tasks; one buffer means one all-reduce per meta-step.
    """
    flat = torch.cat([g.reshape(-1) for g in grads.tensors()])
    count = torch.tensor([float(num_tasks)], dtype=flat.dtype, device=flat.device)
    return torch.cat([flat * num_tasks, count])


def unpack_gradients(buffer: Tensor, like: MetaGradients) -> MetaGradients:
    """The task-weighted mean held in a summed ``pack_gradients`` buffer, shaped like ``like``."""
    mean = buffer[:-1] / buffer[-1]
    pieces = iter(mean.split([g.numel() for g in like.tensors()]))
    params = {
        module_id: {name: next(pieces).view_as(g) for name, g in named.items()}
        for module_id, named in like.params.items()
    }
    log_lrs = {key: next(pieces).view_as(g) for key, g in like.log_lrs.items()}
    return MetaGradients(params, log_lrs, like.inner)


def average_gradients(
    grads: MetaGradients, num_tasks: int, all_reduce: AllReduce | None = None
) -> MetaGradients:
    """The mean meta-gradient over all workers' tasks (one all-reduce of one buffer)."""
    buffer = pack_gradients(grads, num_tasks)
    (all_reduce or dist.all_reduce)(buffer)
    return unpack_gradients(buffer, grads)


class DataParallelMetaLearner(MetaLearner):
    """A ``MetaLearner`` whose meta-step averages its meta-gradients over all workers.

    ``step`` computes this worker's meta-gradients, all-reduces them, and applies the
    mean; since every worker starts from the same state and applies the same mean with
    the same optimizer, the meta-parameters stay identical (``check_in_sync`` verifies
    it). The task metrics it logs stay this worker's own, for ``CrossWorkerMetrics``.
    """

    def compute_meta_gradients(
        self, meta_batch: MetaBatch, *, support_loss_after: bool = True
    ) -> tuple[MetaGradients, dict]:
        grads, metrics = super().compute_meta_gradients(
            meta_batch, support_loss_after=support_loss_after
        )
        return average_gradients(grads, int(metrics["num_tasks"])), metrics


class CrossWorkerMetrics(MetricsLogger):
    """A metrics logger whose ``reduce()`` merges every worker's metrics.

    Each worker logs its own values; ``reduce()`` gathers every worker's
    ``reduce(with_counts=True)`` and merges them with ``merge_reduced`` (sums and
    throughputs added, means weighted by their counts), so every worker gets the same
    result. ``reduce(with_counts=True)`` stays this worker's own.
    """

    def reduce(self, *, with_counts: bool = False, reset: bool = True) -> dict[str, Any]:
        local = super().reduce(with_counts=True, reset=reset)
        return local if with_counts else merge_reduced(gather(local))


def gather(value: Any) -> list[Any]:
    """Every worker's ``value`` (picklable), in rank order."""
    parts: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(parts, value)
    return parts


def broadcast(value: Any) -> Any:
    """Rank 0's ``value`` on every worker."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def params_checksum(learner: MetaLearner) -> Tensor:
    """A float64 checksum of the meta-parameters and learned learning rates.

    Position-weighted, so swapped entries change it too; computed the same way on every
    worker, so identical parameters give bitwise identical checksums.
    """
    tensors = [p for named in learner.meta_params.values() for p in named.values()]
    tensors += list(learner.log_lrs.values())
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1).double() for t in tensors])
        weights = torch.linspace(1.0, 2.0, flat.numel(), dtype=flat.dtype, device=flat.device)
        return (flat * weights).sum()


def check_in_sync(learner: MetaLearner, iteration: int) -> None:
    """Raise ``ParametersDivergedError`` unless every worker holds the same meta-parameters.

    One all-reduce of two numbers: the largest checksum and the negated smallest.
    """
    checksum = params_checksum(learner)
    extremes = torch.stack([checksum, -checksum])
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX)
    highest, lowest = float(extremes[0]), -float(extremes[1])
    if highest != lowest:
        raise ParametersDivergedError(
            f"meta-parameters differ between the {dist.get_world_size()} workers at "
            f"iteration {iteration} (weights_seq_no {learner.weights_seq_no}): checksums "
            f"range from {lowest!r} to {highest!r}, this worker (rank {dist.get_rank()}) has "
            f"{float(checksum)!r}; expected one value. The workers must start from the same "
            "learner state and apply the same averaged meta-gradients"
        )
