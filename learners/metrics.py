"""MetricsLogger: named statistics reduced on demand, scoped per learner, mergeable across workers.

Each key has one reduction, fixed when it is first logged:

- `mean`: mean of the last `window` values (a sliding window; `reduce()` keeps it);
- `ema`: exponential moving average, `ema += coeff * (value - ema)`;
- `sum`: sum of the values logged since the last `reduce()` (which resets it);
- `lifetime_sum`: sum of every value ever logged (survives `reduce()` and checkpoints);
- `throughput`: sum of the values since the last `reduce()` divided by the seconds elapsed.

Values may be floats or one-element tensors; tensors are kept as they are (detached) and only
turned into floats by `reduce()`/`get_state()`, so logging never waits on a device.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

REDUCTIONS = ("mean", "ema", "sum", "lifetime_sum", "throughput")

Value = float | int | Tensor
# Tensors a sum holds back before adding them (`_Stat.push`): bounds what it keeps alive.
_PENDING = 256


def _clock() -> float:
    return time.perf_counter()


@dataclass
class _Stat:
    reduce: str
    window: int
    ema_coeff: float
    values: deque[Value] = field(init=False)
    ema: Value | None = None
    total: Value = 0.0
    count: int = 0
    since: float = field(default_factory=lambda: _clock())
    pending: list[Value] = field(default_factory=list)
    """Values not yet added to `total`, in order (see `push`)."""

    def __post_init__(self) -> None:
        self.values = deque(maxlen=self.window)

    def push(self, value: Value) -> None:
        self.count += 1
        if self.reduce == "mean":
            self.values.append(value)
        elif self.reduce == "ema":
            self.ema = value if self.ema is None else self.ema + self.ema_coeff * (value - self.ema)
        elif isinstance(value, Tensor) or self.pending:
            # A tensor added per step would cost a device operation per metric and step
            # (tens of microseconds beside a compiled meta-step): tensors wait here and are
            # added when read, in the same order, so the total is the same to the bit.
            self.pending.append(value)
            if len(self.pending) >= _PENDING:
                self.fold()
        else:
            self.total = self.total + value

    def fold(self) -> None:
        """Add the pending values to `total`."""
        total = self.total
        for value in self.pending:
            total = total + value
        self.total = total
        self.pending.clear()

    def result(self) -> tuple[float, int]:
        """(value, weight for merging); what it reads stays the same values."""
        self.fold()
        if self.reduce == "mean":
            values = _floats(self.values)
            # Kept as floats: a window read every few steps converts each value once, not
            # once per read (a history point every 10 steps over a window of 100 did 10x).
            self.values = deque(values, maxlen=self.window)
            return (sum(values) / len(values) if values else float("nan")), len(values)
        if self.reduce == "ema":
            return (float("nan") if self.ema is None else float(self.ema)), self.count
        if self.reduce == "throughput":
            elapsed = max(_clock() - self.since, 1e-9)
            return float(self.total) / elapsed, 1
        return float(self.total), 1

    def reset_period(self) -> None:
        if self.reduce in ("sum", "throughput"):
            self.total = 0.0
            self.pending.clear()
            self.since = _clock()


def _floats(values: Iterable[Value]) -> list[float]:
    values = list(values)
    out = [0.0 if isinstance(v, Tensor) else float(v) for v in values]
    by_device: dict[torch.device, list[int]] = {}
    for index, value in enumerate(values):
        if isinstance(value, Tensor):
            by_device.setdefault(value.device, []).append(index)
    # One transfer (one device sync) per device instead of one per value.
    for indices in by_device.values():
        stacked = torch.stack([values[i].reshape(()).to(torch.float64) for i in indices])
        for index, number in zip(indices, stacked.tolist(), strict=True):
            out[index] = number
    return out


def _check_value(key: str, value: Value) -> Value:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"metric {key!r}: expected a float or a one-element tensor, "
                f"got a tensor of shape {tuple(value.shape)}"
            )
        # Detaching costs a new tensor object per value; most values have no graph to drop.
        return value.detach() if value.requires_grad else value
    if isinstance(value, bool) or not isinstance(value, float | int):
        raise TypeError(f"metric {key!r}: expected a number, got {type(value).__name__}")
    return value


class MetricsLogger:
    """Named statistics; `scope(name)` gives a view whose keys live under `name/`."""

    def __init__(self, *, window: int = 100, ema_coeff: float = 0.01) -> None:
        if window < 1 or not 0 < ema_coeff <= 1:
            raise ValueError(
                f"window must be >= 1 and ema_coeff in (0, 1], got {window} and {ema_coeff}"
            )
        self.window = window
        self.ema_coeff = ema_coeff
        self._stats: dict[str, _Stat] = {}
        self._claimed: set[str] = set()
        self._prefix = ""

    def scope(self, name: str) -> MetricsLogger:
        """A view sharing this logger's storage under `name/`; each name may be claimed once,
        so two learners can never write to each other's keys."""
        if not name or "/" in name:
            raise ValueError(f"scope name {name!r} must be non-empty and contain no '/'")
        prefix = f"{self._prefix}{name}/"
        if prefix in self._claimed:
            raise ValueError(
                f"metrics scope {prefix[:-1]!r} is already in use; give each learner its own name"
            )
        self._claimed.add(prefix)
        view = copy.copy(self)  # shares the storage; keeps a subclass's behaviour
        view._prefix = prefix
        return view

    def log(
        self,
        key: str,
        value: Value,
        *,
        reduce: str = "mean",
        window: int | None = None,
        ema_coeff: float | None = None,
    ) -> None:
        """Record one value of `key` (the reduction is fixed by the first call)."""
        value = _check_value(key, value)
        full = self._prefix + key
        stat = self._stats.get(full)
        if stat is None:
            if reduce not in REDUCTIONS:
                raise ValueError(f"metric {key!r}: reduce {reduce!r} is not one of {REDUCTIONS}")
            stat = _Stat(reduce, window or self.window, ema_coeff or self.ema_coeff)
            self._stats[full] = stat
        elif stat.reduce != reduce:
            raise ValueError(
                f"metric {key!r} is reduced with {stat.reduce!r}; it cannot also use {reduce!r}"
            )
        stat.push(value)

    def log_many(self, values: Mapping[str, Value], reductions: Mapping[str, str | None]) -> None:
        """`log` for every item of `values`, reduced as `reductions` says ('mean' for a key it
        does not name; None: not logged). One call per meta-step rather than one per metric,
        whose cost shows beside a compiled step of half a millisecond."""
        stats, prefix = self._stats, self._prefix
        for key, value in values.items():
            reduce = reductions.get(key, "mean")
            if reduce is None:
                continue
            stat = stats.get(prefix + key)
            if stat is None or stat.reduce != reduce:
                self.log(key, value, reduce=reduce)  # a new key, or a reduction refused
            else:
                stat.push(_check_value(key, value))

    def log_dict(self, values: Mapping[str, Value], *, reduce: str = "mean") -> None:
        """`log` for every item."""
        for key, value in values.items():
            self.log(key, value, reduce=reduce)

    def peek(self, key: str) -> float:
        """The current reduced value of one key, without resetting anything."""
        stat = self._stats.get(self._prefix + key)
        if stat is None:
            raise KeyError(f"no metric {key!r}; logged: {sorted(self._own())}")
        return stat.result()[0]

    def reduce(self, *, with_counts: bool = False, reset: bool = True) -> dict[str, Any]:
        """Every key's reduced value (keys relative to this scope); resets `sum`/`throughput`
        unless `reset=False` (a reader between two log points must not shorten their period).

        With `with_counts`, each value is `{"value", "count", "reduce"}` for `merge_reduced`.
        """
        out: dict[str, Any] = {}
        for key, stat in self._own().items():
            value, count = stat.result()
            if reset:
                stat.reset_period()
            out[key] = (
                {"value": value, "count": count, "reduce": stat.reduce} if with_counts else value
            )
        return out

    def get_state(self) -> dict[str, Any]:
        """Plain Python (floats, lists) for this scope's keys; JSON- and torch.save-able."""
        stats = {}
        for key, stat in self._own().items():
            stat.fold()
            stats[key] = {
                "reduce": stat.reduce,
                "window": stat.window,
                "ema_coeff": stat.ema_coeff,
                "values": _floats(stat.values),
                "ema": None if stat.ema is None else float(stat.ema),
                "total": float(stat.total),
                "count": stat.count,
            }
        return {"stats": stats}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Replace this scope's keys by those of `state` (throughput clocks restart now)."""
        for key in list(self._own()):
            del self._stats[self._prefix + key]
        for key, saved in state["stats"].items():
            stat = _Stat(saved["reduce"], saved["window"], saved["ema_coeff"])
            stat.values.extend(saved["values"])
            stat.ema, stat.total, stat.count = saved["ema"], saved["total"], saved["count"]
            self._stats[self._prefix + key] = stat

    def _own(self) -> dict[str, _Stat]:
        cut = len(self._prefix)
        return {k[cut:]: s for k, s in self._stats.items() if k.startswith(self._prefix)}


def merge_reduced(parts: Iterable[Mapping[str, Mapping[str, Any]]]) -> dict[str, float]:
    """One result from several workers' `reduce(with_counts=True)` outputs.

    Sums, lifetime sums and throughputs are added; means and EMAs are averaged weighted by
    their counts. A key reduced differently by two workers is an error.
    """
    merged: dict[str, list[Any]] = {}
    for part in parts:
        for key, item in part.items():
            entry = merged.setdefault(key, [item["reduce"], 0.0, 0])
            if entry[0] != item["reduce"]:
                raise ValueError(
                    f"metric {key!r} is reduced with {entry[0]!r} by one worker "
                    f"and {item['reduce']!r} by another"
                )
            if entry[0] in ("mean", "ema"):
                if item["count"]:
                    entry[1] += item["value"] * item["count"]
                    entry[2] += item["count"]
            else:
                entry[1] += item["value"]
                entry[2] += 1
    return {
        key: (total / count if count else float("nan")) if reduce in ("mean", "ema") else total
        for key, (reduce, total, count) in merged.items()
    }
