"""What every Ray Train worker runs: its own task stream, the averaged meta-step, checkpoints.

``train_loop_per_worker`` reads top to bottom: which attempt this is and the nodes of the
workers -> the task samples, read here from the dataset's files (local disk or S3; in
memory, or window by window when streaming) -> this rank's stream ->
the learner (the driver's initial state, or the last checkpoint) -> ``run_meta_training``
with callbacks that check the workers agree and report checkpoints to Ray Train.

A checkpoint is one directory that every worker writes its shard into (Ray Train merges
them): the layout and contents of ``flows.runs.train_state``, the same as an in-process run's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from flows.config import MetaTrainConfig
from flows.process.heap import keep_freed_memory
from flows.runs.run_storage import RunDir, run_at
from flows.runs.train_state import learner_shard, restore
from flows.stages.progress import TrainingProgress
from flows.stages.train import training_stream
from learners.meta.meta_batch import MetaBatch
from learners.training.data_parallel import (
    CrossWorkerMetrics,
    DataParallelMetaLearner,
    broadcast,
    check_in_sync,
)
from learners.training.loop import History, run_meta_training
from pipeline.io.checkpoints import write_shard
from pipeline.streams.learner_stream import LearnerStream
from pipeline.tasks.samples import read_task_samples

ATTEMPTS_DIR = "ray/train/offmeta-attempts"
"""Under the run directory (beside Ray Train's checkpoints): one file per attempt of the
worker group, ``attempt-0000``, ``attempt-0001``..., naming the host and process that made it."""

_log = logging.getLogger("offmeta.scale_out")


class WorkerFault(NamedTuple):
    """A fault drill: the worker of ``rank`` kills its own process (SIGKILL, no chance to
    clean up) before meta-step ``iteration`` of the first attempt, as a lost machine would."""

    rank: int
    iteration: int


def train_loop_per_worker(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``TorchTrainer`` loop. Rank 0 returns where the last attempt resumed, how many
    attempts came before it, the summary of the task samples and the distinct Ray node ids
    of the workers; the learner state is in the final checkpoint.

    ``config`` (built by ``flows.scale_out.driver``): ``cfg`` (the run config as JSON),
    ``dataset`` (the ``DatasetInfo`` of the training data: its files, no rows),
    ``sampling`` (``task_samples`` keywords), ``initial_state`` (the learner state every
    worker starts from), ``parent``, ``run_dir`` (the run directory: an absolute path or its
    ``s3://`` URI), ``s3_access`` (the driver's ``S3Access``), ``use_gpu``,
    ``cpus_per_worker`` and ``fault`` (a ``WorkerFault`` drill, or None).
    """
    import ray
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    cfg = MetaTrainConfig.model_validate(config["cfg"])
    torch.set_num_threads(max(1, math.floor(config["cpus_per_worker"])))
    keep_freed_memory()
    device = ray.train.torch.get_device() if config["use_gpu"] else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    run = run_at(config["run_dir"], config["s3_access"])
    attempt = broadcast(record_attempt(run) if rank == 0 else None)
    nodes: list[str] = [""] * world
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())

    # Every worker plans the same epochs from the same files and seed (the plan of an epoch
    # spans every task), then keeps the meta-batches of its own rank.
    samples = read_task_samples(config["dataset"], **config["sampling"])
    tasks, training = cfg.tasks, cfg.training
    stream = training_stream(cfg, samples, device=device, rank=rank, world=world)
    learner = DataParallelMetaLearner.from_state(
        config["initial_state"], device=device, metrics=CrossWorkerMetrics()
    )
    start, history, parent, resumed_from = 0, None, config["parent"], None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            resumed = restore(
                Path(directory), rank=rank, world=world, learner=learner, stream=stream
            )
        start, history, parent = resumed.iteration, resumed.history, resumed.parent
        resumed_from = start
    check_in_sync(learner, start)

    progress = TrainingProgress(
        total=training.iterations,
        start=start,
        rows_per_iteration=world * tasks.meta_batch * (tasks.support + tasks.query),
        logger=_log,
    )

    def on_log(iteration: int, metrics: dict[str, Any]) -> None:
        check_in_sync(learner, iteration)
        if rank == 0:
            progress(iteration, metrics)

    def on_checkpoint(iteration: int, history: History) -> None:
        shard = learner_shard(iteration, learner, stream, rank=rank, history=history, parent=parent)
        with tempfile.TemporaryDirectory(prefix="offmeta-ckpt-") as directory:
            # Ray Train copies the directory into its storage and registers it afterwards.
            write_shard(directory, rank, shard, durable=False)
            ray.train.report(
                {"iteration": iteration},
                checkpoint=ray.train.Checkpoint.from_directory(directory),
            )

    progress.begin()
    try:
        fault = WorkerFault(**config["fault"]) if config["fault"] is not None else None
        batches = _meta_batches(stream, start, training.iterations, fault, rank, attempt)
        history = run_meta_training(
            learner,
            batches,
            start=start,
            stop=training.iterations,
            log_every=training.log_every,
            checkpoint_every=training.checkpoint_every,
            history_every=training.history_every,
            history=history,
            on_log=on_log,
            on_checkpoint=on_checkpoint,
            check_vectorized=cfg.learners.check_vectorized == "first",
        )
    finally:
        stream.close()
    if rank != 0:
        return None
    # Tensors cannot travel in a return value: the state is in the final checkpoint.
    return {
        "resumed_from": resumed_from,
        "restarts": attempt,
        "tasks": samples.summary(),
        "worker_nodes": sorted(set(nodes)),
    }


def _meta_batches(
    stream: LearnerStream,
    start: int,
    stop: int,
    fault: WorkerFault | None,
    rank: int,
    attempt: int,
) -> Iterator[MetaBatch]:
    """Meta-batches ``start + 1 .. stop`` of this worker's stream.

    With a ``fault`` for this rank, the worker kills its own process before that iteration
    of the first attempt. It first waits until Ray Train has registered the checkpoints
    reported so far, so the drill knows which one the run resumes from (a real failure may
    come before the newest is registered; the run then resumes from the one before).
    """
    for iteration, meta_batch in enumerate(stream.take(stop - start), start + 1):
        if fault == (rank, iteration) and attempt == 0:
            _die_after_checkpoints_registered()
        yield meta_batch


def _die_after_checkpoints_registered() -> None:
    import ray.train

    ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
    )
    os.kill(os.getpid(), signal.SIGKILL)


def record_attempt(run: RunDir) -> int:
    """Mark one more attempt of ``run``'s worker group; returns how many came before it.

    A restart that happens before the first checkpoint leaves no other trace, so the
    attempts are counted here rather than in checkpoints. Each attempt creates the first
    free ``attempt-NNNN`` only if nobody has (``RunDir.create``: O_EXCL, or S3's
    ``If-None-Match``), so the count is exact whichever node the worker runs on.
    """
    attempt = len(run.files(ATTEMPTS_DIR))
    mark = json.dumps({"host": socket.gethostname(), "pid": os.getpid()}).encode()
    while not run.create(f"{ATTEMPTS_DIR}/attempt-{attempt:04d}", mark):
        attempt += 1
    return attempt
