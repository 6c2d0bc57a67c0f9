"""The evaluation's pictures stored with every published version, each beside its data.

- ``adaptation.png`` / ``adaptation.json``: held-out query loss against inner steps, mean ±
  standard error across tasks, for this version and, when it was warm-started, its parent
  (from the parent's ``evaluation.json``) on the same axes;
- ``rollouts.png`` / ``rollouts.json``: for environments the evaluation rolls out, the data of
  ``flows.evaluation.trajectories``: the paths of the episodes on four held-out tasks, one
  panel per task, when the environment reports positions; otherwise each task's mean
  return, unadapted against adapted.

The learning curve (``learning_curve.png``) is the artifact store's, drawn from the history
(``pipeline.artifacts.plots``). Pictures are drawn from the JSON data alone, on the same fixed
canvas, so the same data gives the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from flows.evaluation.heldout import EvaluationReport
from pipeline.artifacts.plots import axis_scale, json_bytes, new_figure, png_bytes

ADAPTATION_PX = (720, 480)
ROLLOUTS_PX = (800, 960)
"""Picture sizes in pixels (width, height)."""
POLICY_STYLES = {
    "unadapted": {"color": "tab:gray", "linestyle": "--"},
    "adapted": {"color": "tab:blue", "linestyle": "-"},
    "expert": {"color": "tab:green", "linestyle": ":"},
}
_CURVE_COLORS = ("tab:blue", "tab:gray")
"""This version's curve, then its parent's."""
_BEHAVIOR_STYLE = {"color": "tab:orange", "linewidth": 0.8, "alpha": 0.6}


def picture_files(
    name: str,
    report: EvaluationReport,
    parent: tuple[str, Mapping[str, Any]] | None = None,
) -> list[tuple[str, bytes]]:
    """``(file name, bytes)`` of the pictures and their JSON for a version of ``name``.

    ``parent`` is ``(parent spec, its evaluation.json)`` for a warm-started run.
    """
    adaptation = adaptation_data(name, report, parent)
    files = [
        ("adaptation.png", draw_adaptation(adaptation)),
        ("adaptation.json", json_bytes(adaptation)),
    ]
    if report.trajectories is not None:
        rollouts = {"title": f"{name}: held-out rollouts", **report.trajectories}
        files += [
            ("rollouts.png", draw_rollouts(rollouts)),
            ("rollouts.json", json_bytes(rollouts)),
        ]
    return files


def adaptation_data(
    name: str, report: EvaluationReport, parent: tuple[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """``adaptation.json``: one curve per version, each with its steps, mean, standard error
    (None where fewer than two tasks were evaluated) and per-task losses."""
    curves = [_curve("this version", None, report.to_dict())]
    if parent is not None:
        spec, evaluation = parent
        curves.append(_curve(f"parent {spec}", spec, evaluation))
    return {
        "title": f"{name}: held-out query loss after adaptation",
        "x": "inner steps on the support set",
        "curves": curves,
    }


def draw_adaptation(data: Mapping[str, Any]) -> bytes:
    """``adaptation.png`` from ``adaptation_data``."""
    figure = new_figure(*ADAPTATION_PX)
    ax = figure.subplots()
    for index, curve in enumerate(data["curves"]):
        errors = curve["stderr"] if all(e is not None for e in curve["stderr"]) else None
        ax.errorbar(
            curve["steps"],
            curve["mean"],
            yerr=errors,
            marker="o",
            capsize=4,
            linewidth=1.6,
            label=f"{curve['label']} ({curve['tasks']} tasks)",
            color=_CURVE_COLORS[index % len(_CURVE_COLORS)],
        )
    values = [v for c in data["curves"] for v in c["mean"]]
    ax.set_yscale(axis_scale(values))
    ax.set_xlabel(data["x"])
    ax.set_ylabel("query loss, mean ± standard error over tasks")
    ax.set_xticks(sorted({s for c in data["curves"] for s in c["steps"]}))
    ax.grid(alpha=0.3)
    ax.legend()
    figure.suptitle(data["title"])
    return png_bytes(figure)


def draw_rollouts(data: Mapping[str, Any]) -> bytes:
    """``rollouts.png`` from a ``flows.evaluation.trajectories`` result (plus a ``title``): one
    panel per task with each policy's path and return, the start and the goal (when known)
    marked; or, without paths, the per-task returns."""
    if "goals" not in data:
        return _draw_task_returns(data)
    goals = data["goals"]
    columns = 2 if len(goals) > 1 else 1
    rows = math.ceil(len(goals) / columns)
    figure = new_figure(*ROLLOUTS_PX)
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for ax, goal in zip(axes, goals, strict=False):
        _draw_goal(ax, goal, data["adapt_steps"])
    for ax in axes[len(goals) :]:
        ax.set_axis_off()
    figure.suptitle(data["title"])
    return png_bytes(figure)


def _draw_goal(ax: Any, goal: Mapping[str, Any], adapt_steps: int) -> None:
    recorded = goal.get("behavior") or []
    for index, episode in enumerate(recorded):
        xs, ys = zip(*episode["positions"], strict=True)
        mean = sum(e["return"] for e in recorded) / len(recorded)
        label = f"behaviour data, mean of {len(recorded)}: {mean:.2f}" if index == 0 else None
        ax.plot(xs, ys, label=label, **_BEHAVIOR_STYLE)
    for policy, episode in goal["policies"].items():
        xs, ys = zip(*episode["positions"], strict=True)
        name = f"adapted ({adapt_steps} steps)" if policy == "adapted" else policy
        style = POLICY_STYLES.get(policy, {})
        ax.plot(xs, ys, linewidth=1.8, label=f"{name}: {episode['return']:.2f}", **style)
    start = next(iter(goal["policies"].values()))["positions"][0]
    ax.plot(*start, marker="o", color="black", markersize=6, linestyle="none", label="start")
    target = goal["goal"]
    if target is not None and len(target) == 2:
        ax.plot(*target, marker="*", color="tab:red", markersize=14, linestyle="none", label="goal")
        ax.set_title(f"task {goal['task_id']}, goal ({target[0]:.2f}, {target[1]:.2f})")
    else:
        ax.set_title(f"task {goal['task_id']}")
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(alpha=0.3)
    # Below the panel: paths may cross any part of it.
    ax.legend(
        title="episode return",
        fontsize="small",
        title_fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.08),
        ncols=2,
    )


def _draw_task_returns(data: Mapping[str, Any]) -> bytes:
    """Each task's mean return, one bar per policy, tasks side by side."""
    tasks = data["tasks"]
    policies = list(tasks[0]["returns"]) if tasks else []
    figure = new_figure(*ROLLOUTS_PX)
    ax = figure.subplots()
    width = 0.8 / max(1, len(policies))
    for index, policy in enumerate(policies):
        name = f"adapted ({data['adapt_steps']} steps)" if policy == "adapted" else policy
        values = [task["returns"][policy] for task in tasks]
        mean = sum(values) / len(values)
        ax.bar(
            [row + (index - (len(policies) - 1) / 2) * width for row in range(len(tasks))],
            values,
            width=width,
            label=f"{name}: mean {mean:.3g}",
            color=POLICY_STYLES.get(policy, {}).get("color"),
        )
    ax.set_xticks(range(len(tasks)))
    ax.set_xticklabels([task["task_id"] for task in tasks], rotation=90, fontsize="small")
    ax.set_xlabel("held-out task")
    ax.set_ylabel(f"mean return over {data['episodes']} episodes")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    figure.suptitle(data["title"])
    return png_bytes(figure)


def _curve(label: str, spec: str | None, evaluation: Mapping[str, Any]) -> dict[str, Any]:
    means = {int(steps): float(value) for steps, value in evaluation["query_loss"].items()}
    per_task = {
        int(steps): list(values)
        for steps, values in (evaluation.get("query_loss_per_task") or {}).items()
    }
    steps = sorted(means)
    return {
        "label": label,
        "version": spec,
        "tasks": evaluation["tasks"],
        "steps": steps,
        "mean": [means[s] for s in steps],
        "stderr": [_standard_error(per_task.get(s, ())) for s in steps],
        "per_task": {str(s): per_task[s] for s in steps if s in per_task},
    }


def _standard_error(values: Sequence[float]) -> float | None:
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return math.sqrt(variance / n)
