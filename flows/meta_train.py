"""The ``meta_train`` Prefect flow: validate dataset -> train -> evaluate -> publish.

Each task is a thin wrapper of one typed stage function (``flows.datasets``,
``flows.training``, ``flows.evaluation``, ``flows.publishing``) that can be called
without Prefect. The flow owns the Ray session and decides retries:

- ``train`` retries ``training.retries`` times and resumes from its last checkpoint,
  kept under ``training.checkpoint_dir/<flow run id>``;
- ``publish`` retries too; an idempotency key per flow run makes a retried publish return
  the version the first attempt wrote;
- bad input (ValueError, TypeError: the dataset, the config) and non-finite arithmetic
  fail at once, since retrying would fail the same way.

``meta_train_from_file`` reads the config from a YAML file at run time, for work-pool
deployments (``prefect.yaml``) that point at a checked-in config.
"""

# No `from __future__ import annotations` here: Prefect validates flow parameters against the
# signature's annotations, which must be classes, not strings, when a deployment runs the flow.
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefect import Task, flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import TaskRun
from prefect.context import FlowRunContext, TaskRunContext
from prefect.exceptions import MissingContextError
from prefect.runtime import flow_run
from prefect.states import State

from flows.config import MetaTrainConfig, load_config
from flows.datasets import Datasets, validate_datasets
from flows.evaluation import EvaluationReport, evaluate
from flows.publishing import prefect_artifact_keys, publish, show_in_prefect
from flows.runtime import code_version, ray_session, torch_threads
from flows.training import TrainResult, train
from pipeline.artifacts import ArtifactRef

_PERMANENT = (ValueError, TypeError, NotImplementedError, ArithmeticError)


def _transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Retry condition: retry unless the error says the input is wrong."""
    return not isinstance(state.data, _PERMANENT)


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


@task(name="validate-dataset", cache_policy=NO_CACHE, persist_result=False)
def validate_dataset(cfg: MetaTrainConfig) -> Datasets:
    """``flows.datasets.validate_datasets``, with the summaries logged."""
    datasets = validate_datasets(cfg)
    logger = _logger()
    for split, summary in datasets.summary().items():
        logger.info("%s data: %s", split, summary)
    return datasets


@task(name="train", cache_policy=NO_CACHE, persist_result=False, retry_condition_fn=_transient)
def train_learner(cfg: MetaTrainConfig, datasets: Datasets) -> TrainResult:
    """``flows.training.train`` in this flow run's directory, with a progress artifact."""
    progress = prefect_artifact_keys(cfg.artifacts.name)["progress"] if _in_run() else None
    return train(
        cfg,
        datasets.train,
        run_dir=run_directory(cfg),
        logger=_logger(),
        progress_artifact=progress,
    )


@task(name="evaluate", cache_policy=NO_CACHE, persist_result=False)
def evaluate_learner(
    cfg: MetaTrainConfig, trained: TrainResult, datasets: Datasets
) -> EvaluationReport:
    """``flows.evaluation.evaluate`` of the trained learner on the held-out data."""
    return evaluate(cfg, trained.learner_state, datasets.heldout, logger=_logger())


@task(
    name="publish",
    cache_policy=NO_CACHE,
    persist_result=False,
    retries=2,
    retry_delay_seconds=2,
    retry_condition_fn=_transient,
)
def publish_result(
    cfg: MetaTrainConfig, trained: TrainResult, report: EvaluationReport, datasets: Datasets
) -> ArtifactRef:
    """``flows.publishing.publish`` (idempotent per flow run), then the Prefect artifacts."""
    ref = publish(
        cfg,
        trained,
        report,
        datasets,
        flow_run_id=flow_run.get_id(),
        code_version=code_version(),
    )
    if _in_run():
        show_in_prefect(ref, cfg.artifacts.root, trained, report)
    _logger().info("published %s (%s)", ref, ref.uri)
    return ref


@flow(name="meta-train", persist_result=False)
def meta_train(cfg: MetaTrainConfig) -> RunSummary:
    """Meta-train on ``cfg.data.train``, evaluate on ``cfg.data.heldout``, publish."""
    with ray_session(cfg.ray), torch_threads(cfg.training.torch_threads):
        datasets = validate_dataset(cfg)
        trained = train_learner.with_options(
            retries=cfg.training.retries, retry_delay_seconds=cfg.training.retry_delay_s
        )(cfg, datasets)
        report = evaluate_learner(cfg, trained, datasets)
        ref = publish_result(cfg, trained, report, datasets)
    return RunSummary(
        artifact=str(ref),
        uri=ref.uri,
        flow_run_id=flow_run.get_id(),
        parent=trained.parent,
        resumed_from=trained.resumed_from,
        evaluation=report,
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


def run_directory(cfg: MetaTrainConfig) -> Path:
    """``training.checkpoint_dir/<flow run id>`` (``local`` outside a flow run)."""
    return Path(cfg.training.checkpoint_dir) / (flow_run.get_id() or "local")
