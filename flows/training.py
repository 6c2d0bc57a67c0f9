"""Stage 2 of a run: meta-train in this process, checkpointing, resuming from the last
checkpoint of the same run directory.

``train`` reads top to bottom: task samples -> stream -> learner -> (resume | warm start |
fresh) -> ``run_meta_training`` with a checkpoint callback. A checkpoint holds the learner
state, the stream position and the learning-curve history, so a retried attempt continues
exactly where the last checkpoint left off and ends with the parameters an uninterrupted
run would have.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flows.config import MetaTrainConfig
from flows.progress import TrainingProgress
from learners.meta import MetaLearner
from learners.training import History, run_meta_training
from pipeline.artifacts import ArtifactNotFoundError, ArtifactStore
from pipeline.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from pipeline.dataset import Episodes
from pipeline.streams import split_for_learners
from pipeline.tasks import TaskSamples, task_samples

_log = logging.getLogger(__name__)

# Test seam: when set, called with the iteration after each checkpoint is saved; a test
# raises from it once to play a crash between checkpoints. Nothing else can be replaced.
_checkpoint_hook: Callable[[int], None] | None = None


@dataclass(frozen=True)
class TrainResult:
    """What the training stage hands to evaluation and publishing."""

    learner_state: dict[str, Any]
    """``MetaLearner.get_state()`` after the last iteration (rebuild with ``from_state``)."""
    history: History
    """Learning curve: metric -> value at each logged iteration."""
    iterations: int
    weights_seq_no: int
    final_metrics: dict[str, float]
    """The last logged value of each learning-curve metric."""
    parent: str | None
    """``name:version`` the run was warm-started from, if any."""
    resumed_from: int | None
    """Iteration of the checkpoint the last attempt resumed from (None: no resume)."""
    checkpoint: Path
    """The final checkpoint."""
    tasks: dict[str, Any]
    """``TaskSamples.summary()`` of the training data."""
    restarts: int = 0
    """Times Ray Train started the worker group again after a worker failed (0 in process)."""
    num_learners: int = 0
    """Ray Train workers that trained (0: trained in this process)."""


def train(
    cfg: MetaTrainConfig,
    data: Episodes,
    *,
    run_dir: str | Path,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
    progress_artifact: str | None = None,
) -> TrainResult:
    """Meta-train on ``data`` for ``cfg.training.iterations`` meta-steps.

    Checkpoints go to ``run_dir/checkpoints``; if one is there already (a retried
    attempt), training resumes from the newest. ``progress_artifact`` is the key of a
    Prefect progress artifact to keep up to date (inside a Prefect run only).
    """
    logger = logger or _log
    if cfg.learners.num_learners > 0:
        # Imported here: flows.scale_out imports this module (TrainResult,
        # build_task_samples, warm_start).
        from flows.scale_out import train_on_ray

        return train_on_ray(cfg, data, run_dir=run_dir, logger=logger)
    training, tasks = cfg.training, cfg.tasks
    checkpoints = Path(run_dir) / "checkpoints"
    samples = build_task_samples(cfg, data, logger)
    (stream,) = split_for_learners(
        samples, 1, minibatch_size=tasks.meta_batch, seed=tasks.seed, device=training.device
    )
    learner = MetaLearner(cfg.learners.meta_config(), device=training.device)

    with contextlib.closing(stream):
        found = latest_checkpoint(checkpoints)
        if found is not None:
            checkpoint = load_checkpoint(found)
            learner.set_state(checkpoint.state["learner"])
            stream.restore(checkpoint.state["streams"][0])
            start, resumed_from = checkpoint.step, checkpoint.step
            history, parent = checkpoint.state["history"], checkpoint.state["parent"]
        else:
            torch.manual_seed(training.seed)
            start, resumed_from, history = 0, None, None
            parent = warm_start(cfg, learner, logger) if training.warm_start else None

        def save(iteration: int, history: History) -> None:
            state = {
                "learner": learner.get_state(),
                "streams": [stream.state()],
                "history": history,
                "parent": parent,
            }
            save_checkpoint(checkpoints, iteration, state, keep=training.keep_checkpoints)
            if _checkpoint_hook is not None:
                _checkpoint_hook(iteration)

        progress = TrainingProgress(
            total=training.iterations,
            start=start,
            rows_per_iteration=tasks.meta_batch * (tasks.support + tasks.query),
            logger=logger,
            artifact_key=progress_artifact,
        )
        progress.begin()
        history = run_meta_training(
            learner,
            stream.take(training.iterations - start),
            start=start,
            stop=training.iterations,
            log_every=training.log_every,
            checkpoint_every=training.checkpoint_every,
            history=history,
            on_log=progress,
            on_checkpoint=save,
        )
    final = latest_checkpoint(checkpoints)
    assert final is not None  # the loop checkpoints after its last iteration
    return TrainResult(
        learner_state=learner.get_state(),
        history=history,
        iterations=training.iterations,
        weights_seq_no=learner.weights_seq_no,
        final_metrics={name: values[-1] for name, values in history.items()},
        parent=parent,
        resumed_from=resumed_from,
        checkpoint=final,
        tasks=samples.summary(),
    )


def build_task_samples(
    cfg: MetaTrainConfig, data: Episodes, logger: logging.Logger | logging.LoggerAdapter
) -> TaskSamples:
    """The training task samples ``cfg.tasks`` asks for, summarised in the log (with a
    warning when tasks smaller than K + Q were left out)."""
    tasks = cfg.tasks
    samples = task_samples(
        data,
        support=tasks.support,
        query=tasks.query,
        modules_to_update=cfg.learners.data_modules,
        skip_small_tasks=tasks.skip_small_tasks,
        gamma=cfg.data.gamma,
    )
    logger.info("task samples: %s", samples.summary())
    if samples.skipped_tasks:
        logger.warning("left out %d tasks smaller than K + Q", len(samples.skipped_tasks))
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
