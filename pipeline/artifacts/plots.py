"""The learning curve stored with a version when a metrics history is given, and the canvas
every stored picture is drawn on.

Pictures are PNGs from matplotlib's Agg canvas (no pyplot, no display, no global figure
state) at a fixed size and resolution, without the "Software" text chunk, so the same data
gives the same bytes and hence the same blob. Each picture's data is stored beside it as
JSON (``learning_curve.json`` here), so a reader can redraw or check it.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pipeline.artifacts.errors import ArtifactError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

DPI = 100
"""Pixels per inch of every stored picture: sizes below are pixels / DPI."""
ITERATION = "iteration"
"""A history series that is the x axis (meta-iterations), not a metric."""
CURVE_WIDTH_PX = 800
CURVE_PANEL_PX = 230
CURVE_TITLE_PX = 50
"""The learning curve is CURVE_WIDTH_PX wide and CURVE_TITLE_PX + CURVE_PANEL_PX per panel
high."""
_MAX_PANELS = 8
_SPREAD_FOR_LOG = 10.0
"""A panel whose positive values span at least this factor is drawn on a log axis."""
_BAND_SUFFIXES = ("_min", "_max")
_FAMILY_SUFFIXES = ("_mean", *_BAND_SUFFIXES)


def check_history(history: object) -> dict[str, list[float]]:
    """``{metric: [value per recorded point]}`` with finite numbers, or a clear error.

    An ``iteration`` series, when present, holds the strictly increasing meta-iterations of
    the points (ints) and every other series has one value per iteration.
    """
    if not isinstance(history, Mapping) or not history:
        raise ArtifactError(
            f"history must be a non-empty dict {{metric: [values]}}, got {history!r:.80}"
        )
    checked: dict[str, list[float]] = {}
    for metric, values in history.items():
        if not isinstance(metric, str) or not metric:
            raise ArtifactError(f"history key {metric!r} must be a non-empty string")
        if isinstance(values, str | bytes) or not isinstance(values, Sequence) or not values:
            raise ArtifactError(f"history[{metric!r}] must be a non-empty list of numbers")
        checked[metric] = (
            _iterations(values) if metric == ITERATION else _finite_series(metric, values)
        )
    if ITERATION in checked:
        if len(checked) == 1:
            raise ArtifactError(
                "history holds only 'iteration'; expected at least one metric beside it"
            )
        expected = len(checked[ITERATION])
        for metric, values in checked.items():
            if len(values) != expected:
                raise ArtifactError(
                    f"history[{metric!r}] has {len(values)} values but history['iteration'] "
                    f"has {expected}; expected one value per recorded iteration"
                )
    return checked


def learning_curve_files(history: Mapping[str, Sequence[float]], title: str) -> dict[str, bytes]:
    """``learning_curve.png`` and ``learning_curve.json`` (the panels drawn and the history
    they were drawn from) for a ``check_history`` result."""
    panels = _panels([name for name in history if name != ITERATION])[:_MAX_PANELS]
    x_label = ITERATION if ITERATION in history else "logged point"
    data = {
        "title": title,
        "x": x_label,
        "panels": [
            {"name": name, "metrics": metrics, "scale": axis_scale(_values(history, metrics))}
            for name, metrics in panels
        ],
        "history": {name: list(values) for name, values in history.items()},
    }
    return {
        "learning_curve.png": _learning_curve_png(data),
        "learning_curve.json": json_bytes(data),
    }


def new_figure(width_px: int, height_px: int) -> Figure:
    """An empty figure of exactly ``width_px`` x ``height_px`` pixels on an Agg canvas.

    matplotlib is imported here: publishing without pictures never pays for it.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG bytes, the same for the same drawing (no "Software" text chunk)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI, metadata={"Software": None})
    return buffer.getvalue()


def json_bytes(data: object) -> bytes:
    """A picture's data as JSON text: indented, keys in the order given, no NaN."""
    return (json.dumps(data, indent=2, allow_nan=False) + "\n").encode()


def axis_scale(values: Sequence[float]) -> str:
    """``"log"`` when every value is positive and they span a decade or more, else
    ``"linear"``."""
    if not values or min(values) <= 0:
        return "linear"
    return "log" if max(values) / min(values) >= _SPREAD_FOR_LOG else "linear"


def _learning_curve_png(data: Mapping[str, Any]) -> bytes:
    history, panels = data["history"], data["panels"]
    figure = new_figure(CURVE_WIDTH_PX, CURVE_TITLE_PX + CURVE_PANEL_PX * len(panels))
    axes = figure.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    first = next(name for name in history if name != ITERATION)
    x = history.get(ITERATION, list(range(len(history[first]))))
    for ax, panel in zip(axes, panels, strict=True):
        metrics = panel["metrics"]
        bands = [m for m in metrics if m.endswith(_BAND_SUFFIXES)]
        if len(bands) == 2:
            low, high = sorted(bands, key=lambda m: m.endswith("_max"))
            ax.fill_between(
                x, history[low], history[high], alpha=0.25, linewidth=0, label="min – max"
            )
        for metric in metrics:
            if metric not in bands or len(bands) != 2:
                ax.plot(x, history[metric], linewidth=1.4, label=metric)
        ax.set_yscale(panel["scale"])
        ax.set_ylabel(panel["name"])
        ax.grid(alpha=0.3, which="both" if panel["scale"] == "log" else "major")
        if len(metrics) > 1:
            ax.legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("meta-iteration" if data["x"] == ITERATION else data["x"])
    figure.suptitle(data["title"])
    return png_bytes(figure)


def _panels(metrics: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Metrics grouped into panels: every loss on one shared axis (they compare directly),
    ``x_mean``/``x_min``/``x_max`` together as ``x``, anything else on its own."""
    panels: dict[str, list[str]] = {}
    for metric in metrics:
        panels.setdefault(_family(metric), []).append(metric)
    return list(panels.items())


def _family(metric: str) -> str:
    if "loss" in metric:
        return "loss"
    for suffix in _FAMILY_SUFFIXES:
        if metric.endswith(suffix) and len(metric) > len(suffix):
            return metric[: -len(suffix)]
    return metric


def _values(history: Mapping[str, Sequence[float]], metrics: Sequence[str]) -> list[float]:
    return [value for metric in metrics for value in history[metric]]


def _finite_series(metric: str, values: Sequence[Any]) -> list[float]:
    series = []
    for step, value in enumerate(values):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ArtifactError(
                f"history[{metric!r}][{step}] is {value!r}, expected a number"
            ) from None
        if not math.isfinite(number):
            raise ArtifactError(
                f"history[{metric!r}][{step}] is {number}; JSON cannot hold NaN or infinity"
            )
        series.append(number)
    return series


def _iterations(values: Sequence[Any]) -> list[int]:
    previous = -1
    for index, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, int) or value <= previous:
            raise ArtifactError(
                f"history['iteration'][{index}] is {value!r}; expected meta-iterations as "
                f"integers increasing from {previous + 1} on"
            )
        previous = value
    return list(values)
