"""Stage 4 of a run: publish the result as the next version of ``artifacts.name``, and show it
in Prefect (link, table and markdown artifacts pointing at that version).

The artifact store is the registry (a directory or ``s3://bucket/prefix``); the Prefect
artifacts are only a view of it: the link goes to the version's manifest (``file://`` or
``s3://``) and says how a consumer loads it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from flows.config import MetaTrainConfig
from flows.evaluation.heldout import EvaluationReport
from flows.evaluation.pictures import picture_files
from flows.runs.train_state import TrainResult
from flows.stages.datasets import Datasets
from pipeline.artifacts import (
    ArtifactNotFoundError,
    ArtifactRef,
    ArtifactStore,
    Lineage,
    parse_root,
)
from pipeline.consumer import learner_state_files

EVALUATION_FILE = "evaluation.json"


def publish(
    cfg: MetaTrainConfig,
    trained: TrainResult,
    report: EvaluationReport,
    datasets: Datasets,
    *,
    flow_run_id: str | None,
    code_version: str | None,
    run_id: str | None = None,
    subflow_run_id: str | None = None,
) -> ArtifactRef:
    """Publish the trained parameters with metrics, config, lineage, learning curve and the
    evaluation's pictures (``flows.evaluation.pictures``; a warm-started run's adaptation curve
    shows its parent's beside its own).

    ``flow_run_id`` is the flow run that was triggered, ``subflow_run_id`` the training flow's
    own run when that ran as its subflow. The lineage's ``extras["checkpoint"]`` is the final
    checkpoint as an absolute ``file://`` URI, or its ``s3://`` URI (a relative
    ``training.checkpoint_dir`` is relative to the run's working directory, which a reader of
    the manifest does not know).

    Publishing again for the same ``run_id`` (the run directory's name: a retried task, a
    resumed run), or without one for the same ``flow_run_id``, returns the version the
    first attempt published.
    """
    metrics: dict[str, Any] = {
        "iterations": trained.iterations,
        "weights_seq_no": trained.weights_seq_no,
        **{f"train_{name}": value for name, value in trained.final_metrics.items()},
        **report.metrics(),
    }
    lineage = Lineage(
        dataset_fingerprint=datasets.train.fingerprint,
        parent=trained.parent,
        flow_run_id=flow_run_id,
        subflow_run_id=subflow_run_id,
        code_version=code_version,
        weights_seq_no=trained.weights_seq_no,
        extras={
            "train_dataset": datasets.train.root,
            "heldout_dataset": datasets.heldout.root,
            "heldout_fingerprint": datasets.heldout.fingerprint,
            "resumed_from_iteration": trained.resumed_from,
            "restarts": trained.restarts,
            "num_learners": trained.num_learners,
            "worker_nodes": list(trained.worker_nodes),
            "checkpoint": _checkpoint_uri(trained.checkpoint),
            **_selections(datasets),
        },
    )
    files = [
        # The full learner state, which pipeline.consumer.load_learner rebuilds.
        *learner_state_files(trained.learner_state),
        (EVALUATION_FILE, (json.dumps(report.to_dict(), indent=2) + "\n").encode()),
    ]
    store = ArtifactStore(cfg.artifacts.root)
    files += picture_files(cfg.artifacts.name, report, _parent_evaluation(store, trained.parent))
    return store.publish(
        cfg.artifacts.name,
        trained.learner_state["params"],
        metrics=metrics,
        config=cfg,
        lineage=lineage,
        history=trained.history,
        files=files,
        idempotency_key=f"meta-train/{key}" if (key := run_id or flow_run_id) else None,
    )


def _parent_evaluation(store: ArtifactStore, parent: str | None) -> tuple[str, Any] | None:
    """``(parent, its evaluation.json)`` for ``adaptation.png``; None without a parent or
    when the parent holds no evaluation (published by another tool)."""
    if parent is None:
        return None
    try:
        return parent, json.loads(store.read_file(parent, EVALUATION_FILE))
    except ArtifactNotFoundError:
        return None


def prefect_artifact_keys(name: str) -> dict[str, str]:
    """Keys of the Prefect artifacts of ``name`` (lowercase letters, digits and dashes)."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "artifact"
    return {
        "link": f"{slug}-version",
        "table": f"{slug}-evaluation",
        "markdown": f"{slug}-report",
        "progress": f"{slug}-training-progress",
        "mlflow": f"{slug}-mlflow",
    }


def consumer_snippet(ref: ArtifactRef, store_root: str) -> str:
    """One line of Python that loads the version's parameters, on any machine that can reach
    the store (``pip install offmeta`` is enough: no Ray, no Prefect)."""
    root = str(parse_root(store_root))
    return (
        f"from pipeline.artifacts import ArtifactStore; "
        f"params = ArtifactStore({root!r}).load_params({str(ref)!r})"
    )


def show_in_prefect(
    ref: ArtifactRef, store_root: str, trained: TrainResult, report: EvaluationReport
) -> None:
    """Create the link, table and markdown Prefect artifacts of a published version."""
    from prefect.artifacts import (
        create_link_artifact,
        create_markdown_artifact,
        create_table_artifact,
    )

    keys = prefect_artifact_keys(ref.name)
    create_link_artifact(
        link=ref.uri,
        link_text=f"{ref} manifest ({ref.uri})",
        key=keys["link"],
        description=f"Published version {ref} in the artifact store {parse_root(store_root)}; "
        f"load it with `{consumer_snippet(ref, store_root)}`",
    )
    create_table_artifact(
        table=report.table(),
        key=keys["table"],
        description=f"Held-out evaluation of {ref}: query loss before/after adaptation",
    )
    create_markdown_artifact(
        markdown=_markdown(ref, store_root, trained, report),
        key=keys["markdown"],
        description=f"Meta-training report for {ref}",
    )


def _markdown(
    ref: ArtifactRef, store_root: str, trained: TrainResult, report: EvaluationReport
) -> str:
    rows = report.table()
    table = ["| measure | value | change |", "|---|---:|---:|"]
    table += [f"| {r['measure']} | {r['value']} | {r['change']} |" for r in rows]
    final_loss = trained.final_metrics.get("query_loss", float("nan"))
    resumed = (
        f"resumed from the checkpoint at iteration {trained.resumed_from}"
        if trained.resumed_from is not None
        else "no restart"
    )
    return "\n".join(
        [
            f"# {ref}",
            "",
            f"Published to `{parse_root(store_root)}` ([manifest]({ref.uri})); params digest "
            f"`{ref.digest}`.",
            "",
            f"Load it anywhere the store is reachable: `{consumer_snippet(ref, store_root)}`",
            "",
            f"- parent: `{trained.parent or 'none'}`",
            f"- iterations: {trained.iterations} ({resumed}); weights_seq_no "
            f"{trained.weights_seq_no}",
            f"- final training query loss: {final_loss:.5g}",
            "",
            f"## Held-out evaluation ({report.tasks} tasks)",
            "",
            *table,
            "",
            "## Pictures",
            "",
            *_picture_lines(ref, store_root),
        ]
    )


def _picture_lines(ref: ArtifactRef, store_root: str) -> list[str]:
    """Markdown naming each stored picture, its data file and where the version keeps them."""
    described = {
        "learning_curve.png": "training losses, gradient norm and learned inner learning rates "
        "by meta-iteration",
        "adaptation.png": "held-out query loss against inner steps (and the parent's)",
        "rollouts.png": "episodes of the unadapted, adapted (and expert) policies: paths on "
        "four held-out tasks, or each task's return",
    }
    files = ArtifactStore(store_root).get(str(ref)).files
    lines = [
        f"- `{png}` ({text}; data: `{png.removesuffix('.png')}.json`)"
        for png, text in described.items()
        if png in files
    ]
    return [
        *lines,
        "",
        f"They are files of `{ref}` in the artifact store `{store_root}`; write them out with "
        f"`offmeta artifacts export {ref} DIR --root {store_root}`.",
    ]


def _checkpoint_uri(checkpoint: Path | str) -> str:
    """The final checkpoint's ``s3://`` URI as it is, a directory as an absolute ``file://``
    URI."""
    if isinstance(checkpoint, str) and checkpoint.lower().startswith("s3://"):
        return checkpoint
    return Path(checkpoint).absolute().as_uri()


def _selections(datasets: Datasets) -> dict[str, Any]:
    """``{"episodes_where": {split: what it kept}}`` for the datasets a filter selected."""
    kept = {
        split: info.selection.summary()
        for split, info in (("train", datasets.train), ("heldout", datasets.heldout))
        if info.selection is not None
    }
    return {"episodes_where": kept} if kept else {}
