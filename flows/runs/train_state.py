"""What a training run checkpoints and hands on: the same in this process and on Ray Train.

Every checkpoint of a run, in process (``flows.stages.train``) or on Ray Train workers
(``flows.scale_out``), is one ``pipeline.io.checkpoints`` directory with one shard per learner:

- every learner's shard: ``iteration``, its ``stream`` position and its own ``metrics``;
- learner 0's shard also: the ``learner`` state (parameters, optimizer, RNG,
  ``weights_seq_no``), the learning-curve ``history`` and the warm-start ``parent``.

``learner_shard`` builds a shard, ``restore`` loads one checkpoint into a learner and its
stream, and ``train_result`` turns a run's final checkpoint into the ``TrainResult`` that
evaluation and publishing take, whichever way the run trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learners.meta.learner import MetaLearner
from learners.training.loop import ITERATION, History
from pipeline.io.checkpoints import CheckpointError, read_shard, shard_ranks
from pipeline.streams.learner_stream import LearnerStream


@dataclass(frozen=True)
class TrainResult:
    """What the training stage hands to evaluation and publishing."""

    learner_state: dict[str, Any]
    """``MetaLearner.get_state()`` after the last iteration (rebuild with ``from_state``)."""
    history: History
    """Learning curve: ``iteration`` and each metric's value there (``learners.training.loop``)."""
    iterations: int
    weights_seq_no: int
    final_metrics: dict[str, float]
    """The last logged value of each learning-curve metric."""
    parent: str | None
    """``name:version`` the run was warm-started from, if any."""
    resumed_from: int | None
    """Iteration of the checkpoint the last attempt resumed from (None: no resume)."""
    checkpoint: Path | str
    """The final checkpoint: its directory, or its ``s3://`` URI in Ray Train's storage."""
    tasks: dict[str, Any]
    """``TaskSamples.summary()`` of the training data."""
    restarts: int = 0
    """Times Ray Train started the worker group again after a worker failed (0 in process)."""
    num_learners: int = 0
    """Ray Train workers that trained (0: trained in this process)."""
    worker_nodes: tuple[str, ...] = ()
    """Distinct Ray node ids of the workers of the last attempt (empty: in this process)."""


@dataclass(frozen=True)
class Resumed:
    """Where a learner restored from a checkpoint continues."""

    iteration: int
    history: History
    parent: str | None


def learner_shard(
    iteration: int,
    learner: MetaLearner,
    stream: LearnerStream,
    *,
    rank: int,
    history: History,
    parent: str | None,
) -> dict[str, Any]:
    """Learner ``rank``'s shard of the checkpoint taken after ``iteration``."""
    shard: dict[str, Any] = {
        "iteration": iteration,
        "stream": stream.state(),
        "metrics": learner.metrics.get_state(),
    }
    if rank == 0:
        shard.update(learner=learner.get_state(), history=history, parent=parent)
    return shard


def restore(
    directory: Path, *, rank: int, world: int, learner: MetaLearner, stream: LearnerStream
) -> Resumed:
    """Load the checkpoint ``directory`` into learner ``rank`` of ``world`` and its stream."""
    ranks = shard_ranks(directory)
    if ranks != list(range(world)):
        raise CheckpointError(
            f"checkpoint {directory} holds the shards of learners {ranks} but this run has "
            f"{world} learner(s); resume it with {len(ranks)} learner(s), or start a new run"
        )
    lead = read_shard(directory, 0)
    own = lead if rank == 0 else read_shard(directory, rank)
    if own["iteration"] != lead["iteration"]:
        raise CheckpointError(
            f"checkpoint {directory}: learner {rank} saved iteration {own['iteration']} but "
            f"learner 0 saved iteration {lead['iteration']}; expected one iteration"
        )
    learner.set_state(lead["learner"])
    learner.metrics.set_state(own["metrics"])
    stream.restore(own["stream"])
    return Resumed(iteration=lead["iteration"], history=lead["history"], parent=lead["parent"])


def train_result(
    final_checkpoint: Path,
    *,
    location: Path | str | None = None,
    iterations: int,
    resumed_from: int | None,
    tasks: dict[str, Any],
    restarts: int = 0,
    num_learners: int = 0,
) -> TrainResult:
    """The ``TrainResult`` of a run whose last checkpoint is in the directory
    ``final_checkpoint``; ``location`` is where the checkpoint lives when that directory is
    a local copy (of one in S3, say)."""
    location = final_checkpoint if location is None else location
    lead = read_shard(final_checkpoint, 0)
    if lead["iteration"] != iterations:
        raise CheckpointError(
            f"the last checkpoint of the run, {location}, is from iteration "
            f"{lead['iteration']}; expected the final iteration {iterations}"
        )
    history = lead["history"]
    return TrainResult(
        learner_state=lead["learner"],
        history=history,
        iterations=iterations,
        weights_seq_no=lead["learner"]["weights_seq_no"],
        final_metrics={name: values[-1] for name, values in history.items() if name != ITERATION},
        parent=lead["parent"],
        resumed_from=resumed_from,
        checkpoint=location,
        tasks=tasks,
        restarts=restarts,
        num_learners=num_learners,
    )
