"""Stage 2 of a run: meta-train in this process, checkpointing, resuming from the last
checkpoint of the same run directory.

``train`` reads top to bottom: task samples -> stream -> learner -> (resume | warm start |
fresh) -> ``run_meta_training`` with a checkpoint callback. A checkpoint holds the learner
state, the stream position and the learning-curve history (``flows.runs.train_state``), so a
retried attempt, or a run resumed after its process was killed, continues exactly where
the last checkpoint left off and ends with the parameters an uninterrupted run would have.

Training on Ray Train workers is ``flows.scale_out.train_on_ray``; the flow chooses.
``warm_start`` serves both (Ray Train workers read their task samples themselves).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

import torch

from flows.config import MetaTrainConfig
from flows.runs.train_state import TrainResult, learner_shard, restore, train_result
from flows.stages.normalization import learner_config
from flows.stages.progress import TrainingProgress
from flows.stages.task_checks import sampling_options
from learners.meta.learner import MetaLearner
from learners.training.loop import History, run_meta_training
from pipeline.artifacts import ArtifactNotFoundError, ArtifactStore
from pipeline.io.checkpoints import latest_checkpoint, save_checkpoint
from pipeline.reads.episodes import Episodes
from pipeline.streams.learner_stream import LearnerStream, split_for_learners
from pipeline.tasks.grouping import TaskSamples
from pipeline.tasks.options import TaskStream
from pipeline.tasks.samples import task_samples
from pipeline.tasks.windows import TaskWindows

_log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
"""Under a run directory: the in-process checkpoints."""


def train(
    cfg: MetaTrainConfig,
    data: Episodes,
    *,
    run_dir: str | Path,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    progress_artifact: str | None = None,
) -> TrainResult:
    """Meta-train on ``data`` for ``cfg.training.iterations`` meta-steps in this process.

    Checkpoints go to ``run_dir/checkpoints``; if one is there already (a retried
    attempt, a resumed run), training resumes from the newest. ``progress_artifact`` is
    the key of a Prefect progress artifact to keep up to date (inside a Prefect run only).
    """
    logger = logger or _log
    if cfg.learners.num_learners != 0:
        raise ValueError(
            f"flows.stages.train.train trains in this process (learners.num_learners 0), got "
            f"learners.num_learners={cfg.learners.num_learners}; use "
            "flows.scale_out.train_on_ray for Ray Train workers"
        )
    training, tasks = cfg.training, cfg.tasks
    checkpoints = Path(run_dir) / CHECKPOINTS
    samples = build_task_samples(cfg, data, logger)
    stream = training_stream(cfg, samples, device=training.device)
    learner = MetaLearner(learner_config(cfg, data), device=training.device)

    with contextlib.closing(stream):
        found = latest_checkpoint(checkpoints)
        if found is not None:
            resumed = restore(found, rank=0, world=1, learner=learner, stream=stream)
            start, resumed_from = resumed.iteration, resumed.iteration
            history, parent = resumed.history, resumed.parent
        else:
            torch.manual_seed(training.seed)
            start, resumed_from, history = 0, None, None
            parent = warm_start(cfg, learner, logger) if training.warm_start else None

        def save(iteration: int, history: History) -> None:
            shard = learner_shard(
                iteration, learner, stream, rank=0, history=history, parent=parent
            )
            save_checkpoint(checkpoints, iteration, shard, keep=training.keep_checkpoints)

        progress = TrainingProgress(
            total=training.iterations,
            start=start,
            rows_per_iteration=tasks.meta_batch * (tasks.support + tasks.query),
            logger=logger,
            artifact_key=progress_artifact,
        )
        progress.begin()
        run_meta_training(
            learner,
            stream.take(training.iterations - start),
            start=start,
            stop=training.iterations,
            log_every=training.log_every,
            checkpoint_every=training.checkpoint_every,
            history_every=training.history_every,
            history=history,
            on_log=progress,
            on_checkpoint=save,
            prefetch=training.prefetch,
            check_vectorized=cfg.learners.check_vectorized == "first",
        )
    final = latest_checkpoint(checkpoints)
    assert final is not None  # the loop checkpoints after its last iteration
    return train_result(
        final,
        iterations=training.iterations,
        resumed_from=resumed_from,
        tasks=samples.summary(),
    )


def training_stream(
    cfg: MetaTrainConfig,
    samples: TaskSamples | TaskWindows,
    *,
    device: torch.device | str,
    rank: int = 0,
    world: int = 1,
) -> LearnerStream:
    """Learner ``rank``'s meta-batches of ``samples`` out of ``world`` learners, as
    ``cfg.tasks`` deals them (meta-batch size, seed, ``shift_obs``): the train stage's, a Ray
    Train worker's and the bench's one way of dealing them."""
    tasks = cfg.tasks
    (stream,) = split_for_learners(
        TaskStream(samples, ranks=[rank], shift=tasks.obs_shift()),
        world,
        minibatch_size=tasks.meta_batch,
        seed=tasks.seed,
        device=device,
    )
    return stream


def build_task_samples(
    cfg: MetaTrainConfig, data: Episodes, logger: logging.Logger | logging.LoggerAdapter
) -> TaskSamples | TaskWindows:
    """The training task samples ``cfg.tasks`` asks for, summarised in the log (with a
    warning when tasks too small for one sample were left out: fewer than K + Q
    transitions, or too few episodes for support sets of episodes)."""
    samples = task_samples(data, **sampling_options(cfg))
    logger.info("task samples: %s", samples.summary())
    if samples.skipped_tasks:
        logger.warning(
            "left out %d tasks too small for one task sample (tasks.skip_small_tasks)",
            len(samples.skipped_tasks),
        )
    return samples


def warm_start(
    cfg: MetaTrainConfig, learner: MetaLearner, logger: logging.Logger | logging.LoggerAdapter
) -> str | None:
    """Load ``<name>@latest``'s parameters into ``learner``; returns ``name:version``, or
    None when nothing has been published under the name yet."""
    store = ArtifactStore(cfg.artifacts.root)
    try:
        manifest = store.get(f"{cfg.artifacts.name}@latest")
    except ArtifactNotFoundError:
        logger.info(
            "warm start: no version of %r in %s yet; starting from the initialisation",
            cfg.artifacts.name,
            store.root,
        )
        return None
    params = store.load_params(manifest, device=learner.device)
    state = learner.get_state()
    _check_fits(manifest.spec, params, state["params"])
    state["params"] = {
        module_id: {name: params[module_id][name] for name in named}
        for module_id, named in state["params"].items()
    }
    # The sequence number counts optimizer steps since the first ancestor.
    state["weights_seq_no"] = manifest.lineage.weights_seq_no or 0
    learner.set_state(state)
    logger.info("warm start from %s (weights_seq_no %d)", manifest.spec, learner.weights_seq_no)
    return manifest.spec


def _check_fits(spec: str, loaded: dict[str, Any], own: dict[str, Any]) -> None:
    for module_id, named in own.items():
        theirs = loaded.get(module_id)
        if theirs is None:
            raise ValueError(
                f"warm start from {spec}: it has no module {module_id!r} (it has "
                f"{sorted(loaded)}); expected the modules of learners.modules"
            )
        for name, tensor in named.items():
            other = theirs.get(name)
            if other is None or tuple(other.shape) != tuple(tensor.shape):
                found = "missing" if other is None else f"shape {list(other.shape)}"
                raise ValueError(
                    f"warm start from {spec}: parameter {module_id}/{name} is {found}, expected "
                    f"shape {list(tensor.shape)}; the model in learners.modules.{module_id} "
                    "differs from the published one (set training.warm_start to false, or "
                    "publish under another artifacts.name)"
                )
