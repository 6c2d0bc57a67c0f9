"""Checks of the pictures a published run holds, shared by the flow tests: each PNG decodes at
its stated size, is exactly what its JSON draws, and the JSON is the run's history and
evaluation."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.image import imread

from flows.evaluation.heldout import EvaluationReport
from flows.evaluation.pictures import ADAPTATION_PX, ROLLOUTS_PX, draw_adaptation, draw_rollouts
from flows.runs.train_state import TrainResult
from pipeline.artifacts import ArtifactRef, ArtifactStore
from pipeline.artifacts.plots import (
    CURVE_PANEL_PX,
    CURVE_TITLE_PX,
    CURVE_WIDTH_PX,
    learning_curve_files,
)
from tests.helpers.tolerances import largest, rounding_tolerance

PICTURES = ("learning_curve", "adaptation", "rollouts")


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) of a PNG after decoding every pixel (RGBA)."""
    pixels = imread(io.BytesIO(png), format="png")
    assert pixels.ndim == 3 and pixels.shape[2] == 4, pixels.shape
    return pixels.shape[1], pixels.shape[0]


def standard_error(values: Sequence[float]) -> float:
    return float(np.std(values, ddof=1) / math.sqrt(len(values)))


def check_published_pictures(
    store: ArtifactStore,
    ref: ArtifactRef | str,
    trained: TrainResult,
    report: EvaluationReport,
    parent_evaluation: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Assert what the version's pictures hold; returns their JSON by picture name."""
    manifest = store.get(str(ref))
    for picture in PICTURES:
        assert manifest.files[f"{picture}.png"].media_type == "image/png"
        assert manifest.files[f"{picture}.json"].media_type == "application/json"
    data = {p: json.loads(store.read_file(manifest, f"{p}.json")) for p in PICTURES}
    png = {p: store.read_file(manifest, f"{p}.png") for p in PICTURES}

    curve = data["learning_curve"]
    assert curve["history"] == trained.history
    assert curve["history"] == json.loads(store.read_file(manifest, "history.json"))
    assert curve["x"] == "iteration"
    assert png_size(png["learning_curve"]) == (
        CURVE_WIDTH_PX,
        CURVE_TITLE_PX + CURVE_PANEL_PX * len(curve["panels"]),
    )
    redrawn = learning_curve_files(trained.history, curve["title"])
    assert redrawn["learning_curve.png"] == png["learning_curve"]

    adaptation = data["adaptation"]
    this = adaptation["curves"][0]
    assert this["label"] == "this version" and this["tasks"] == report.tasks
    assert this["steps"] == list(report.query_loss)
    assert this["mean"] == list(report.query_loss.values())
    per_task = {str(s): v for s, v in report.query_loss_per_task.items()}
    assert this["per_task"] == per_task
    evaluation = json.loads(store.read_file(manifest, "evaluation.json"))
    assert evaluation["query_loss_per_task"] == per_task
    for steps, stderr in zip(this["steps"], this["stderr"], strict=True):
        losses = report.query_loss_per_task[steps]
        # A mean, n deviations squared and summed, a quotient and a square root.
        ops = 4 * len(losses) + 4
        tolerance = rounding_tolerance(np.float64, magnitude=largest(losses), ops=ops)
        assert abs(stderr - standard_error(losses)) <= tolerance
    if parent_evaluation is None:
        assert len(adaptation["curves"]) == 1
    else:
        parent = adaptation["curves"][1]
        assert parent["version"] == manifest.lineage.parent
        assert parent["mean"] == list(parent_evaluation["query_loss"].values())
        assert parent["per_task"] == parent_evaluation["query_loss_per_task"]
    assert png_size(png["adaptation"]) == ADAPTATION_PX
    assert draw_adaptation(adaptation) == png["adaptation"]

    rollouts = data["rollouts"]
    assert rollouts == {"title": f"{manifest.name}: held-out rollouts", **report.trajectories}
    assert png_size(png["rollouts"]) == ROLLOUTS_PX
    assert draw_rollouts(rollouts) == png["rollouts"]
    return data
