"""What every Ray Train worker runs: its own task stream, the averaged meta-step, checkpoints.

``train_loop_per_worker`` reads top to bottom: which attempt this is -> the task samples
(one copy in Ray's object store, shared by the workers of a node) -> this rank's stream ->
the learner (the driver's initial state, or the last checkpoint) -> ``run_meta_training``
with callbacks that check the workers agree and report checkpoints to Ray Train.

A checkpoint is one directory that every worker writes into (Ray Train merges them):
``worker-<rank>.safetensors`` + ``worker-<rank>.json`` per worker, in the no-pickle format
of ``pipeline.checkpoints``. Rank 0's holds the learner state, the learning curve and the
warm-start parent; every worker's holds its stream position and its own metrics.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from flows.config import MetaTrainConfig
from flows.progress import TrainingProgress
from learners.data_parallel import (
    CrossWorkerMetrics,
    DataParallelMetaLearner,
    broadcast,
    check_in_sync,
)
from learners.meta_batch import MetaBatch
from learners.training import History, run_meta_training
from pipeline.checkpoints import CheckpointError, dump_state, parse_state
from pipeline.streams import LearnerStream, split_for_learners

ATTEMPTS_DIR = "offmeta-attempts"
"""Under the Ray Train run directory: one empty file per attempt of the worker group."""

_log = logging.getLogger("offmeta.scale_out")


def train_loop_per_worker(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``TorchTrainer`` loop. Rank 0 returns where the last attempt resumed and how
    many attempts came before it; the learner state is in the final checkpoint.

    ``config`` (built by ``flows.scale_out.driver``): ``cfg`` (the run config as JSON),
    ``samples`` (an ObjectRef of the ``TaskSamples``), ``initial_state`` (the learner
    state every worker starts from), ``parent``, ``use_gpu``, ``cpus_per_worker`` and
    ``fail_at`` (tests only: ``{"rank", "iteration"}`` whose worker kills itself on the
    first attempt).
    """
    import ray
    import ray.train
    import ray.train.torch

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    cfg = MetaTrainConfig.model_validate(config["cfg"])
    torch.set_num_threads(max(1, math.floor(config["cpus_per_worker"])))
    device = ray.train.torch.get_device() if config["use_gpu"] else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    attempt = broadcast(_record_attempt(context.get_storage()) if rank == 0 else None)

    samples = ray.get(config["samples"])
    tasks, training = cfg.tasks, cfg.training
    (stream,) = split_for_learners(
        samples,
        world,
        minibatch_size=tasks.meta_batch,
        seed=tasks.seed,
        device=device,
        ranks=[rank],
    )
    learner = DataParallelMetaLearner.from_state(
        config["initial_state"], device=device, metrics=CrossWorkerMetrics()
    )
    start, history, parent, resumed_from = 0, None, config["parent"], None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as directory:
            shared = _restore(Path(directory), rank, world, learner, stream)
        start, history, parent = shared["iteration"], shared["history"], shared["parent"]
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
        state: dict[str, Any] = {
            "iteration": iteration,
            "stream": stream.state(),
            "metrics": learner.metrics.get_state(),
        }
        if rank == 0:
            state.update(learner=learner.get_state(), history=history, parent=parent)
        with tempfile.TemporaryDirectory(prefix="offmeta-ckpt-") as directory:
            _write_state(Path(directory), rank, state)
            ray.train.report(
                {"iteration": iteration},
                checkpoint=ray.train.Checkpoint.from_directory(directory),
            )

    progress.begin()
    try:
        batches = _meta_batches(
            stream, start, training.iterations, config["fail_at"], rank, attempt
        )
        history = run_meta_training(
            learner,
            batches,
            start=start,
            stop=training.iterations,
            log_every=training.log_every,
            checkpoint_every=training.checkpoint_every,
            history=history,
            on_log=on_log,
            on_checkpoint=on_checkpoint,
        )
    finally:
        stream.close()
    if rank != 0:
        return None
    # Tensors cannot travel in a return value: the state is in the final checkpoint.
    return {"resumed_from": resumed_from, "restarts": attempt}


def _meta_batches(
    stream: LearnerStream,
    start: int,
    stop: int,
    fail_at: Mapping[str, int] | None,
    rank: int,
    attempt: int,
) -> Iterator[MetaBatch]:
    """Meta-batches ``start + 1 .. stop`` of this worker's stream.

    With ``fail_at`` (tests only) the worker of that rank kills its own process, without
    any chance to clean up, before that iteration of the first attempt: a lost machine.
    It first waits until Ray Train has registered the checkpoints reported so far, so the
    test knows which one the run resumes from (a real failure may come before the newest
    is registered; the run then resumes from the one before).
    """
    for iteration, meta_batch in enumerate(stream.take(stop - start), start + 1):
        if (
            fail_at is not None
            and attempt == 0
            and rank == fail_at["rank"]
            and iteration == fail_at["iteration"]
        ):
            _die_after_checkpoints_registered()
        yield meta_batch


def _die_after_checkpoints_registered() -> None:
    import ray.train

    ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
    )
    os.kill(os.getpid(), signal.SIGKILL)


def _record_attempt(storage: Any) -> int:
    """Mark one more attempt under the run directory; returns how many came before it.

    A restart that happens before the first checkpoint leaves no other trace, so the
    attempts are counted here rather than in checkpoints.
    """
    from pyarrow.fs import FileSelector

    filesystem = storage.storage_filesystem
    root = f"{storage.experiment_fs_path}/{ATTEMPTS_DIR}"
    filesystem.create_dir(root, recursive=True)
    earlier = len(filesystem.get_file_info(FileSelector(root)))
    with filesystem.open_output_stream(f"{root}/attempt-{earlier:04d}"):
        pass
    return earlier


def _write_state(directory: Path, rank: int, state: Mapping[str, Any]) -> None:
    tensor_bytes, json_bytes = dump_state(state)
    (directory / f"worker-{rank}.safetensors").write_bytes(tensor_bytes)
    (directory / f"worker-{rank}.json").write_bytes(json_bytes)


def read_state(directory: Path, rank: int = 0) -> dict[str, Any]:
    """What worker ``rank`` saved in the checkpoint ``directory`` (tensors on CPU)."""
    try:
        tensor_bytes = (directory / f"worker-{rank}.safetensors").read_bytes()
        json_bytes = (directory / f"worker-{rank}.json").read_bytes()
    except OSError as error:
        raise CheckpointError(
            f"checkpoint {directory}: cannot read {error.filename}: {error.strerror}"
        ) from None
    return parse_state(tensor_bytes, json_bytes, where=f"{directory}/worker-{rank}")


def _restore(
    directory: Path,
    rank: int,
    world: int,
    learner: DataParallelMetaLearner,
    stream: LearnerStream,
) -> dict[str, Any]:
    """Load the checkpoint into ``learner`` and ``stream``; returns rank 0's state."""
    writers = len(list(directory.glob("worker-*.json")))
    if writers != world:
        raise CheckpointError(
            f"checkpoint {directory} was written by {writers} workers but this run has "
            f"{world}; set learners.num_learners to {writers} to resume it, or start a new run"
        )
    shared = read_state(directory, 0)
    own = shared if rank == 0 else read_state(directory, rank)
    if own["iteration"] != shared["iteration"]:
        raise CheckpointError(
            f"checkpoint {directory}: worker {rank} saved iteration {own['iteration']} but "
            f"worker 0 saved iteration {shared['iteration']}; expected one iteration"
        )
    learner.set_state(shared["learner"])
    learner.metrics.set_state(own["metrics"])
    stream.restore(own["stream"])
    return shared
