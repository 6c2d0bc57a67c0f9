"""The validation split of bench/metaworld.py: settings are chosen on train goals held aside,
never on the held-out goals.

``validation_split`` writes the data of a validation run: the last ``goals`` train goals
(in task-id order) leave the training data and become its held-out data, each with the
train split's ``dataset.json`` entries (so the evaluation env rebuilds those goals). A run
takes them as ``--set data.train=... --set data.heldout=...``: the config is otherwise the
one shipped, its selection and everything else applied as to the real held-out goals.

``checkpoint_curve`` evaluates every checkpoint a run kept on its held-out goals
(``flows.evaluation.heldout.evaluate``, in this process, no Ray): on a validation run, the
learning curve of success over training; with ``final_only``, the run's trained parameters
evaluated again under other evaluation settings (bench/metaworld_published.py's online
context).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from flows.config import MetaTrainConfig


def validation_goals(train: Path, goals: int) -> list[str]:
    """The last ``goals`` task ids of the train split's ``dataset.json``, sorted."""
    tasks = sorted(json.loads((train / "dataset.json").read_text())["tasks"])
    if not 0 < goals < len(tasks):
        raise SystemExit(
            f"--validation-goals {goals}: the train split {train} has {len(tasks)} goals; "
            "hold aside at least one and leave at least one to train on"
        )
    return tasks[-goals:]


def validation_split(train: Path, goals: int, out: Path) -> dict[str, Path]:
    """Write ``out/train`` (``train`` without its validation goals) and ``out/heldout`` (those
    goals), each with ``train``'s ``dataset.json`` cut to its tasks; the ``data.train`` and
    ``data.heldout`` a validation run takes. Written once: an existing split is reused."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    held = validation_goals(train, goals)
    paths = {"train": out / "train", "heldout": out / "heldout"}
    if all((path / "dataset.json").is_file() for path in paths.values()):
        return paths
    table = pa.concat_tables(pq.read_table(p) for p in sorted(train.glob("*.parquet")))
    in_held = pc.is_in(pc.cast(table.column("task_id"), pa.string()), pa.array(held))
    metadata = json.loads((train / "dataset.json").read_text())
    for split, keep in (("train", pc.invert(in_held)), ("heldout", in_held)):
        part = table.filter(keep)
        tasks = {t: v for t, v in metadata["tasks"].items() if (t in held) == (split == "heldout")}
        paths[split].mkdir(parents=True, exist_ok=True)
        pq.write_table(part, paths[split] / "part-00000.parquet")
        described = {**metadata, "split": split, "num_rows": part.num_rows, "tasks": tasks}
        described["files"] = ["part-00000.parquet"]
        (paths[split] / "dataset.json").write_text(json.dumps(described, indent=1) + "\n")
    return paths


def checkpoint_curve(
    cfg: MetaTrainConfig, runs: Path, *, final_only: bool = False
) -> list[dict[str, Any]]:
    """Success (any step, last step) and return of every checkpoint kept under ``runs`` (one
    run directory), or of its last one with ``final_only``, evaluated on ``cfg.data.heldout``
    as ``cfg`` selects it and ``cfg.evaluation`` evaluates; by iteration, each point with the
    evaluation's context (``offline: ...``, ``online: ...``)."""
    from flows.evaluation.heldout import evaluate
    from flows.process.runtime import torch_threads
    from flows.stages.datasets import episode_filter
    from pipeline.io.checkpoints import read_shard
    from pipeline.reads.episodes import read_episodes

    kept = sorted(
        (p for p in runs.glob("*/checkpoints/ckpt-*") if p.is_dir()),
        key=lambda p: (p.name, p.stat().st_mtime),
    )
    if not kept:
        raise SystemExit(f"{runs} holds no checkpoint (expected */checkpoints/ckpt-NNNNNNNN)")
    heldout = read_episodes(cfg.data.heldout, episodes_where=episode_filter(cfg, "heldout"))
    # Online context explored with the library draws its policies from the training tasks.
    train = None
    if cfg.evaluation.context == "online" and cfg.evaluation.context_explore == "library":
        train = read_episodes(cfg.data.train, episodes_where=episode_filter(cfg, "train"))
    points = []
    for directory in kept[-1:] if final_only else kept:
        lead = read_shard(directory, 0)
        # With the run's intra-op threads, as offmeta run evaluates: with torch's default (2
        # here) a batch-1 layer of the rollouts took 7 ms on the busy 2-core machine, and
        # the policy's forward passes most of the online evaluation's time.
        with torch_threads(cfg.training.torch_threads):
            report = evaluate(cfg, lead["learner"], heldout, train=train)
        metrics = report.metrics()
        points.append(
            {
                "iteration": int(lead["iteration"]),
                "context": report.context,
                **{
                    f"{figure}_{policy}": metrics.get(f"heldout_{figure}_{policy}", math.nan)
                    for figure in ("success", "success_final", "return")
                    for policy in ("unadapted", "adapted")
                },
            }
        )
    return sorted(points, key=lambda point: point["iteration"])
