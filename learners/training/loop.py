"""The meta-training loop: meta-batches in, meta-steps taken, metrics logged, checkpoints asked for.

Pure torch: it takes any iterable of meta-batches (a ``LearnerStream.take(n)``, a list in a
test) and two callbacks, so checkpoint storage, progress reporting and failure handling
stay with the caller. Everything it keeps between iterations is the learner (whose
``get_state`` covers parameters, optimizer, RNG and metrics) and the ``history`` the caller
passes in and gets back, so a run resumed from a checkpoint continues exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import MetaBatch
from learners.meta.vectorized_check import check_vectorized_gradients
from learners.training.prefetch import Prefetcher

History = dict[str, list[float]]
"""The learning curve: ``"iteration"`` -> the meta-iterations it was recorded after
(``history_every`` apart, plus the last one), and metric name -> its value at each of them:
the learner's metrics window (mean of the last meta-steps), not one step's value."""

ITERATION = "iteration"
"""The history's x axis: meta-iterations (int) at which the metrics were recorded."""

HISTORY_METRICS = (
    "query_loss",
    "support_loss_before",
    "support_loss_after",
    "grad_norm",
    "inner_lr_mean",
    "inner_lr_min",
    "inner_lr_max",
)
"""Metrics kept in the learning curve: those that depend only on the data and the
parameters (never on time), so a resumed run's history equals an uninterrupted one's."""

OnLog = Callable[[int, dict[str, Any]], None]
"""``on_log(iteration, reduced_metrics)``, after ``log_every`` iterations and the last one."""
OnCheckpoint = Callable[[int, History], None]
"""``on_checkpoint(iteration, history)``, after ``checkpoint_every`` iterations and the last
one; the learner's state at that moment belongs with it."""


def run_meta_training(
    learner: MetaLearner,
    meta_batches: Iterable[MetaBatch],
    *,
    start: int,
    stop: int,
    log_every: int,
    checkpoint_every: int,
    history_every: int | None = None,
    history: History | None = None,
    on_log: OnLog | None = None,
    on_checkpoint: OnCheckpoint | None = None,
    prefetch: int = 0,
    check_vectorized: bool = False,
) -> History:
    """Meta-steps ``start + 1 .. stop`` on the meta-batches, in order; returns the history.

    ``meta_batches`` must hold at least ``stop - start`` meta-batches; only that many are
    read. ``history`` is the one saved with the checkpoint taken at ``start`` (None when
    starting fresh); it is extended, not copied, every ``history_every`` iterations (None:
    at the log points) and after the last one. ``prefetch`` > 0 reads up to that many
    meta-batches ahead in a thread (``learners.training.prefetch``), never past the next checkpoint:
    when ``on_checkpoint`` runs, exactly the meta-batches stepped have been read.
    ``check_vectorized`` compares the vmapped meta-gradients of the first meta-batch with the
    per-task loop's before stepping (``learners.meta.vectorized_check``; the RNG is left as
    it was, so the steps are the same with or without it).
    """
    history_every = log_every if history_every is None else history_every
    cadences = (
        ("log_every", log_every),
        ("checkpoint_every", checkpoint_every),
        ("history_every", history_every),
    )
    for name, value in cadences:
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if not 0 <= start <= stop:
        raise ValueError(f"expected 0 <= start <= stop, got start={start}, stop={stop}")
    if prefetch < 0:
        raise ValueError(f"prefetch must be >= 0, got {prefetch}")
    history = {} if history is None else history

    def readable(iteration: int) -> int:
        """Meta-batches that may be read once ``iteration`` is done: up to the next
        checkpoint, so that a checkpoint never follows a meta-batch read but not stepped."""
        if on_checkpoint is None:
            return stop - start
        return min(stop, (iteration // checkpoint_every + 1) * checkpoint_every) - start

    window = learner.metrics.window
    reads = [log_every, history_every] + ([checkpoint_every] if on_checkpoint is not None else [])

    def read_later(iteration: int) -> bool:
        """Whether a metrics read (a log line, a history point, a checkpoint's saved window)
        will see this iteration's values: the next read comes fewer than `window` steps on,
        so that every window read holds exactly the values it would if every step measured.
        """
        next_read = min([stop, *(-(-iteration // every) * every for every in reads)])
        return next_read - iteration < window

    batches: Iterator[MetaBatch] = iter(meta_batches)
    prefetcher = None
    if prefetch:
        batches = prefetcher = Prefetcher(batches, depth=prefetch, limit=readable(start))
    iteration = start
    try:
        while iteration < stop:
            try:
                meta_batch = next(batches)
            except StopIteration:
                raise ValueError(
                    f"meta_batches ran out after {iteration - start} meta-batches; "
                    f"expected {stop - start} (iterations {start + 1}..{stop})"
                ) from None
            if check_vectorized and iteration == start:
                check_vectorized_gradients(learner, meta_batch)
            learner.step(meta_batch, support_loss_after=read_later(iteration + 1))
            iteration += 1
            last = iteration == stop
            checkpoint = on_checkpoint is not None and (iteration % checkpoint_every == 0 or last)
            logging = iteration % log_every == 0 or last
            recording = iteration % history_every == 0 or last
            if checkpoint or logging or recording:
                # The steps never wait for the device; their non-finite verdicts are read here.
                learner.check_finite()
            if recording:
                # Not resetting: sums and throughputs belong to the log lines' periods.
                current = learner.metrics.reduce(reset=False)
                history.setdefault(ITERATION, []).append(iteration)
                for name in HISTORY_METRICS:
                    if name in current:
                        history.setdefault(name, []).append(float(current[name]))
            if logging:
                reduced = learner.metrics.reduce()
                if on_log is not None:
                    on_log(iteration, reduced)
            if checkpoint:
                on_checkpoint(iteration, history)
                if prefetcher is not None:
                    prefetcher.allow(readable(iteration))
    finally:
        if prefetcher is not None:
            prefetcher.close()
    return history
