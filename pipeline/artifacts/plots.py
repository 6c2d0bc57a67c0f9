"""The learning-curve PNG stored with a version when a metrics history is given."""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence

from pipeline.artifacts.errors import ArtifactError

_MAX_PANELS = 8


def check_history(history: object) -> dict[str, list[float]]:
    """``{metric: [value per logged step]}`` with finite numbers, or a clear error."""
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
        checked[metric] = series
    return checked


def learning_curve_png(history: Mapping[str, Sequence[float]], title: str) -> bytes:
    """One panel per metric (their scales differ), logged step on the x axis.

    At most the first eight metrics are drawn; history.json keeps every series.

    matplotlib is imported here, with the Agg canvas and no pyplot: publishing without a
    history never pays for it, and no global figure state or display is involved.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = list(history)[:_MAX_PANELS]
    figure = Figure(figsize=(6.0, 1.9 * len(metrics) + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics, strict=True):
        values = history[metric]
        ax.plot(range(len(values)), values, linewidth=1.2)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("logged step")
    figure.suptitle(title)
    buffer = io.BytesIO()
    # No "Software" text chunk: the same history gives the same bytes, hence the same blob.
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
