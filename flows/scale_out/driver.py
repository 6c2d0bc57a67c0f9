"""Meta-training on ``learners.num_learners`` Ray Train workers (``TorchTrainer``).

``train_on_ray`` reads top to bottom: what the workers read (the validated dataset's files
and the task-sampling options, never its rows) -> the initial learner state (warm start
included, so every worker starts identical) -> how many CPUs a worker may hold ->
``TorchTrainer.fit`` -> the ``TrainResult`` of the final checkpoint
(``flows.runs.train_state``, as in process), with the restart count and the nodes the
workers ran on.

The driver holds no task sample: each worker reads its own share from local disk or S3
(``flows.scale_out.worker``), so the driver's memory does not grow with the dataset.

Fault tolerance is Ray Train's: a worker that dies takes its worker group down, and Ray
Train starts a new one (up to ``ray.max_failures`` times) that resumes from the last
checkpoint reported through ``ray.train.report``. The run directory
``<run_dir>/ray/train`` (a local path, or in S3: ``flows.scale_out.cluster_storage``) holds
those checkpoints; running again with the same ``run_dir`` (a retried Prefect task) resumes
from them as well. The final checkpoint is read through Ray's checkpoint API, wherever it
lives.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from flows.config import MetaTrainConfig
from flows.runs.retry_policy import is_permanent
from flows.runs.run_storage import S3Access, is_s3
from flows.runs.train_state import TrainResult, train_result
from flows.scale_out.cluster_storage import alive_nodes, check_reachable, cluster_error, ray_storage
from flows.scale_out.worker import WorkerFault, train_loop_per_worker
from flows.stages.normalization import learner_config
from flows.stages.task_checks import sampling_options
from flows.stages.train import warm_start
from learners.meta.learner import MetaLearner
from pipeline.reads.episodes import DatasetInfo, Episodes

_log = logging.getLogger(__name__)

RUN_NAME = "train"
"""Ray Train run name; the run directory is ``<run_dir>/ray/<RUN_NAME>``."""
_CPU_QUANTUM = 1e-4  # Ray rounds fractional resources to 4 decimals.


def worker_cpus(num_learners: int, cluster_cpus: float, reserved_read_cpus: float) -> float:
    """CPUs each of ``num_learners`` workers holds: an equal share of what is left after
    ``reserved_read_cpus``, at most 1.

    Ray Data read tasks need free CPUs to be scheduled at all; workers that held every
    CPU would starve them and every worker would wait for data forever.
    """
    free = cluster_cpus - reserved_read_cpus
    share = math.floor(min(1.0, free / num_learners) / _CPU_QUANTUM) * _CPU_QUANTUM
    if share <= 0:
        raise ValueError(
            f"ray.reserved_read_cpus={reserved_read_cpus} leaves {max(free, 0):g} of the "
            f"cluster's {cluster_cpus:g} CPUs for {num_learners} learners; expected at least "
            f"{num_learners * _CPU_QUANTUM:g}. Lower ray.reserved_read_cpus or join a "
            "larger cluster (ray.address)"
        )
    return share


def scaling_config(cfg: MetaTrainConfig, cluster: Mapping[str, float]) -> Any:
    """The ``ScalingConfig`` of the run on a cluster with ``cluster`` resources
    (``ray.cluster_resources()``); refuses a run the cluster cannot place."""
    from ray.train import ScalingConfig

    learners = cfg.learners.num_learners
    use_gpu = _uses_gpu(cfg.training.device)
    if use_gpu and cluster.get("GPU", 0) < learners:
        raise ValueError(
            f"training.device={cfg.training.device!r} with learners.num_learners={learners} "
            f"needs {learners} GPUs (one per worker); the Ray cluster has "
            f"{cluster.get('GPU', 0):g}. Lower num_learners or set training.device to 'cpu'"
        )
    cpus = worker_cpus(learners, cluster.get("CPU", 0.0), cfg.ray.reserved_read_cpus)
    return ScalingConfig(
        num_workers=learners,
        use_gpu=use_gpu,
        resources_per_worker={"CPU": cpus},
        placement_strategy=cfg.ray.placement_strategy,
    )


def train_on_ray(
    cfg: MetaTrainConfig,
    data: Episodes,
    *,
    run_dir: str | Path,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    fault: WorkerFault | None = None,
) -> TrainResult:
    """Meta-train on ``data`` with ``cfg.learners.num_learners`` Ray Train workers.

    Each worker reads the task samples itself (``read_task_samples``: in memory, or window
    by window with ``tasks.mode: stream``) and draws ``tasks.meta_batch`` tasks per
    meta-step from its own share (``split_for_learners(TaskStream(samples, ranks=[rank]),
    ...)``), so one meta-step sees ``num_learners * meta_batch`` tasks and the averaged
    meta-gradient equals one learner's over all of them. Needs a running Ray session
    (``flows.process.runtime.ray_session``). ``fault`` is a drill: that worker kills itself
    once, and the run must recover.
    """
    import ray
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, RunConfig
    from ray.train.torch import TorchTrainer

    logger = logger or _log
    learners = cfg.learners.num_learners
    if learners < 1:
        raise ValueError(f"learners.num_learners must be >= 1 on Ray Train, got {learners}")
    tasks, training = cfg.tasks, cfg.training
    check_reachable(cfg, alive_nodes())
    storage_path, storage_filesystem = ray_storage(run_dir)
    scaling = scaling_config(cfg, ray.cluster_resources())
    initial_state, parent = _initial_state(cfg, data, logger)
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "cfg": cfg.model_dump(mode="json"),
            "dataset": without_rows(data),
            "sampling": sampling_options(cfg),
            "initial_state": initial_state,
            "parent": parent,
            "run_dir": str(run_dir) if is_s3(run_dir) else str(Path(run_dir).resolve()),
            "s3_access": S3Access.from_environment(),
            "use_gpu": scaling.use_gpu,
            "cpus_per_worker": scaling.num_cpus_per_worker,
            "fault": fault._asdict() if fault is not None else None,
        },
        scaling_config=scaling,
        run_config=RunConfig(
            name=RUN_NAME,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            failure_config=FailureConfig(max_failures=cfg.ray.max_failures),
            checkpoint_config=CheckpointConfig(num_to_keep=training.keep_checkpoints),
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
    logger.info(
        "training on %d Ray Train workers (%g CPU%s each, %d tasks per worker and meta-step)",
        learners,
        scaling.num_cpus_per_worker,
        " + 1 GPU" if scaling.use_gpu else "",
        tasks.meta_batch,
    )
    result = _fit(trainer, run_dir)
    attempts = result.return_value
    logger.info("task samples: %s", attempts["tasks"])
    if attempts["tasks"]["skipped_tasks"]:
        logger.warning("left out %d tasks smaller than K + Q", attempts["tasks"]["skipped_tasks"])
    if attempts["restarts"]:
        logger.warning(
            "the worker group was restarted %d time(s); the last attempt resumed from iteration %s",
            attempts["restarts"],
            attempts["resumed_from"],
        )
    # In place for a local path; a copy in a temporary directory for S3.
    location = result.checkpoint.path
    with result.checkpoint.as_directory() as directory:
        trained = train_result(
            Path(directory),
            location=f"s3://{location}" if storage_filesystem is not None else Path(location),
            iterations=training.iterations,
            resumed_from=attempts["resumed_from"],
            tasks=attempts["tasks"],
            restarts=attempts["restarts"],
            num_learners=learners,
        )
    return dataclasses.replace(trained, worker_nodes=tuple(attempts["worker_nodes"]))


def without_rows(data: DatasetInfo) -> DatasetInfo:
    """``data``'s validated description (files, schema, filesystem), without its Ray
    Dataset: what a worker needs to read the rows itself."""
    return DatasetInfo(
        **{field.name: getattr(data, field.name) for field in dataclasses.fields(DatasetInfo)}
    )


def _fit(trainer: Any, run_dir: str | Path) -> Any:
    """``trainer.fit()``, re-raising a worker's own error when it says the input is wrong,
    or one line when the workers cannot reach the run's storage or offmeta's code (so the
    flow does not retry what would fail the same way)."""
    from ray.train import TrainingFailedError

    try:
        return trainer.fit()
    except TrainingFailedError as error:
        failures = list(getattr(error, "worker_failures", {}).values())
        if failures and all(is_permanent(failure) for failure in failures):
            raise failures[0] from error
        setup = cluster_error([*failures, error], str(run_dir))
        if setup is not None:
            raise setup from error
        raise


def _initial_state(
    cfg: MetaTrainConfig, data: Episodes, logger: logging.Logger | logging.LoggerAdapter
) -> tuple[dict[str, Any], str | None]:
    """The learner state every worker starts from, and the warm-start parent (if any);
    seeded exactly as the in-process stage seeds its learner."""
    learner = MetaLearner(learner_config(cfg, data))
    torch.manual_seed(cfg.training.seed)
    parent = warm_start(cfg, learner, logger) if cfg.training.warm_start else None
    return learner.get_state(), parent


def _uses_gpu(device: str) -> bool:
    if device == "mps":
        raise ValueError(
            "training.device='mps' is not available on Ray Train workers; use 'cpu' or 'cuda', "
            "or set learners.num_learners to 0"
        )
    return device.startswith("cuda")
