"""The ``meta_train`` Prefect flow: validate dataset -> train -> evaluate -> publish.

Each task is a thin wrapper of one typed stage function (``flows.stages.datasets``,
``flows.stages.train`` or ``flows.scale_out``, ``flows.evaluation.heldout``,
``flows.stages.publishing``) that can be called without Prefect. The flow owns the Ray
session, the run directory (``flows.runs.run_dirs``) and decides retries:

- on a Ray cluster of several nodes, local paths are refused before anything is read
  (``flows.scale_out.cluster_storage``);
- the run directory is ``training.checkpoint_dir/<flow run id>``, or with ``resume`` an
  unfinished run's directory, held for the whole run; starting a run also prunes old run
  directories and marks the flow runs of killed runs CRASHED (``flows.runs.crashed``);
- ``train`` trains in this process or, with ``learners.num_learners > 0``, on Ray Train
  workers; it retries ``training.retries`` times and resumes from its last checkpoint;
- ``publish`` retries too; an idempotency key per run directory makes a retried publish,
  or a resumed run's, return the version the first attempt wrote;
- with ``artifacts.mlflow``, ``mirror-to-mlflow`` mirrors the committed version to MLflow
  (``flows.stages.mirroring``): it retries, and an outage is reported, never a failed run;
- what ``flows.runs.retry_policy`` calls permanent (bad input, non-finite arithmetic) fails at
  once, since retrying would fail the same way;
- a SIGINT or SIGTERM stops the stage in progress as ``flows.process.signals.RunInterrupted``
  naming the stage and the run directory to resume (Prefect records the runs CRASHED); in a
  flow-run process of ``offmeta serve`` the process then leaves without the interpreter's
  teardown, which its runner would wait for.

``meta_train_from_file`` reads the config from a YAML file at run time, for work-pool
deployments (``prefect.yaml``) that point at a checked-in config.
"""

# No `from __future__ import annotations` here: Prefect validates flow parameters against the
# signature's annotations, which must be classes, not strings, when a deployment runs the flow.
import logging
from dataclasses import dataclass, field
from typing import Any

from prefect import Task, flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.runtime import flow_run
from prefect.states import State

from flows.config import MetaTrainConfig, load_config
from flows.evaluation.heldout import EvaluationReport, evaluate
from flows.process.runtime import code_version, ray_session, torch_threads
from flows.process.signals import ending_served_run, interruptible
from flows.runs.crashed import mark_crashed
from flows.runs.retention import prune_runs
from flows.runs.retry_policy import is_permanent
from flows.runs.run_dirs import ActiveRun, abandoned_flow_runs, open_run
from flows.runs.train_state import TrainResult
from flows.scale_out import train_on_ray
from flows.scale_out.cluster_storage import alive_nodes, check_reachable
from flows.stages.datasets import Datasets, validate_datasets
from flows.stages.mirroring import (
    MirrorOutcome,
    backfill_command,
    mirror_markdown,
    mirror_published,
)
from flows.stages.publishing import prefect_artifact_keys, publish, show_in_prefect
from flows.stages.timings import StageTimes
from flows.stages.train import train
from pipeline.artifacts import ArtifactRef


def _transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry condition: retry unless ``flows.runs.retry_policy`` says it would fail again."""
    return not is_permanent(state.data)


@dataclass(frozen=True)
class RunSummary:
    """What ``meta_train`` returns (and ``offmeta run`` prints)."""

    artifact: str
    """The published version, ``name:version``."""
    uri: str
    """``file://`` URI of its manifest."""
    flow_run_id: str | None
    parent: str | None
    resumed_from: int | None
    evaluation: EvaluationReport
    run_dir: str
    """The run directory (``training.checkpoint_dir/<run id>``)."""
    mirror: str | None = None
    """With ``artifacts.mlflow``: the mirror's outcome in one line (``MirrorOutcome.line``)."""
    timings: StageTimes = field(default_factory=StageTimes)
    """Seconds each stage took."""


@task(name="validate-dataset", cache_policy=NO_CACHE, persist_result=False)
def validate_dataset(cfg: MetaTrainConfig) -> Datasets:
    """``flows.stages.datasets.validate_datasets``, with the summaries logged."""
    datasets = validate_datasets(cfg)
    logger = _logger()
    for split, summary in datasets.summary().items():
        logger.info("%s data: %s", split, summary)
    return datasets


@task(name="train", cache_policy=NO_CACHE, persist_result=False, retry_condition_fn=_transient)
def train_learner(cfg: MetaTrainConfig, datasets: Datasets, run_dir: str) -> TrainResult:
    """Meta-train in ``run_dir``: ``flows.stages.train.train`` in this process (with a progress
    artifact), or ``flows.scale_out.train_on_ray`` with ``learners.num_learners > 0``."""
    if cfg.learners.num_learners > 0:
        return train_on_ray(cfg, datasets.train, run_dir=run_dir, logger=_logger())
    progress = prefect_artifact_keys(cfg.artifacts.name)["progress"] if _in_run() else None
    return train(cfg, datasets.train, run_dir=run_dir, logger=_logger(), progress_artifact=progress)


@task(name="evaluate", cache_policy=NO_CACHE, persist_result=False)
def evaluate_learner(
    cfg: MetaTrainConfig, trained: TrainResult, datasets: Datasets
) -> EvaluationReport:
    """``flows.evaluation.heldout.evaluate`` of the trained learner on the held-out data."""
    return evaluate(
        cfg, trained.learner_state, datasets.heldout, train=datasets.train, logger=_logger()
    )


@task(
    name="publish",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_transient,
)
def publish_result(
    cfg: MetaTrainConfig,
    trained: TrainResult,
    report: EvaluationReport,
    datasets: Datasets,
    run_id: str,
) -> ArtifactRef:
    """``flows.stages.publishing.publish`` (idempotent per run), then the Prefect artifacts.

    The lineage names the flow run that was triggered (``meta-train-from-file`` for a
    deployment) and, when ``meta-train`` ran as its subflow, that one too."""
    _logger().info(
        "publishing the next version of %s to %s", cfg.artifacts.name, cfg.artifacts.root
    )
    this_run = flow_run.get_id()
    triggered = flow_run.root_flow_run_id if this_run is not None else None
    ref = publish(
        cfg,
        trained,
        report,
        datasets,
        flow_run_id=triggered,
        subflow_run_id=this_run if this_run != triggered else None,
        code_version=code_version(),
        run_id=run_id,
    )
    if _in_run():
        show_in_prefect(ref, cfg.artifacts.root, trained, report)
    _logger().info("published %s (%s)", ref, ref.uri)
    return ref


@task(name="mirror-to-mlflow", cache_policy=NO_CACHE, persist_result=False)
def mirror_result(cfg: MetaTrainConfig, ref: ArtifactRef) -> MirrorOutcome:
    """``flows.stages.mirroring.mirror_published`` (it retries and never fails the run), then
    its Prefect report."""
    outcome = mirror_published(cfg, ref, logger=_logger())
    if _in_run():
        from prefect.artifacts import create_markdown_artifact

        create_markdown_artifact(
            markdown=mirror_markdown(outcome, cfg.artifacts.mlflow.tracking_uri),
            key=prefect_artifact_keys(cfg.artifacts.name)["mlflow"],
            description=f"MLflow mirror of {ref}: "
            + ("mirrored" if outcome.mirrored else "NOT mirrored"),
        )
    return outcome


@flow(name="meta-train", persist_result=False)
def meta_train(cfg: MetaTrainConfig, resume: str | None = None) -> RunSummary:
    """Meta-train on ``cfg.data.train``, evaluate on ``cfg.data.heldout``, publish.

    ``resume`` is the directory of an unfinished run of the same config to continue from
    its last checkpoint (``offmeta run --resume`` finds it); None starts a new run.
    """
    timings = StageTimes()
    with ending_served_run(), ray_session(cfg.ray), torch_threads(cfg.training.torch_threads):
        # Before any read: on several nodes a local path fails late, on the other nodes.
        with interruptible("validate", run_dir=resume):
            check_reachable(cfg, alive_nodes())
            with timings.stage("validate"):
                datasets = validate_dataset(cfg)
        opening = open_run(cfg, resume=resume, flow_run_id=flow_run.get_id())
        with interruptible("train", run_dir=resume), opening as run:
            # Each stage names the run directory a signal leaves to --resume.
            at = str(run.path)
            with interruptible("train", run_dir=at):
                _tidy_runs(cfg, run)
                with timings.stage("train"):
                    trained = train_learner.with_options(
                        retries=cfg.training.retries,
                        retry_delay_seconds=cfg.training.retry_delay_s,
                    )(cfg, datasets, at)
            with interruptible("evaluate", run_dir=at), timings.stage("evaluate"):
                report = evaluate_learner(cfg, trained, datasets)
            with interruptible("publish", run_dir=at), timings.stage("publish"):
                ref = publish_result(cfg, trained, report, datasets, run.run_id)
                run.finish(str(ref), ref.uri)
        mirrored = None
        if cfg.artifacts.mlflow is not None:
            backfill = backfill_command(cfg, ref)
            stopped = interruptible("mirror", published=str(ref), backfill=backfill)
            with stopped, timings.stage("mirror"):
                mirrored = mirror_result(cfg, ref)
    return RunSummary(
        artifact=str(ref),
        uri=ref.uri,
        flow_run_id=flow_run.get_id(),
        parent=trained.parent,
        resumed_from=trained.resumed_from,
        evaluation=report,
        run_dir=str(run.path),
        mirror=mirrored.line() if mirrored is not None else None,
        timings=timings,
    )


@flow(name="meta-train-from-file", persist_result=False)
def meta_train_from_file(config: str, overrides: list[str] | None = None) -> RunSummary:
    """``meta_train`` with the config read from ``config`` (YAML) and ``KEY=VALUE`` overrides.

    Relative paths (``config`` and those inside it) are relative to the working directory,
    which a ``prefect.yaml`` deployment sets to the checkout it was deployed from.
    """
    return meta_train(load_config(config, overrides or ()))


def _logger() -> logging.Logger | logging.LoggerAdapter:
    """The Prefect run logger in a run; a plain logger when a task runs as ``task.fn()``."""
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


def _in_run() -> bool:
    return TaskRunContext.get() is not None or FlowRunContext.get() is not None


def _tidy_runs(cfg: MetaTrainConfig, run: ActiveRun) -> None:
    """Say which run directory this is, prune old ones, and mark the flow runs of killed
    runs (this one's earlier starts included) CRASHED."""
    logger = _logger()
    if run.earlier_flow_runs:
        logger.info("resuming the run in %s", run.path)
    else:
        logger.info("run directory %s (offmeta run --resume continues it if stopped)", run.path)
    root = cfg.training.checkpoint_dir
    training = cfg.training
    for removed in prune_runs(
        root, keep_finished=training.keep_runs, keep_unfinished_days=training.keep_unfinished_days
    ):
        logger.info("removed the old run directory %s (training.keep_runs)", removed)
    killed = [(flow_run_id, run.path) for flow_run_id in run.earlier_flow_runs]
    killed += abandoned_flow_runs(root)
    if _in_run() and killed:
        mark_crashed(dict.fromkeys(killed), logger=logger)
