"""How long each stage of a run took (``StageTimes``), for the one line ``offmeta run``
ends with, and ``read_line`` to read it back (the benches that time runs)."""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class StageTimes:
    """Seconds per stage of the ``meta_train`` flow, in the order they ran."""

    seconds: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as stage ``name`` (added to it if it runs again)."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began

    def line(self, before_flow: float, total: float) -> str:
        """``took ...``: ``total`` seconds split into what ran before the flow
        (``before_flow``), each stage, and the rest (Prefect creating and finishing the
        flow and task runs)."""
        rest = total - before_flow - sum(self.seconds.values())
        stages = ", ".join(f"{name} {s:.1f} s" for name, s in self.seconds.items())
        return (
            f"took {total:.1f} s: {before_flow:.1f} s before the flow (data checks, Ray and "
            f"the Prefect API at once), {stages}, {max(rest, 0.0):.1f} s in Prefect's own "
            "run bookkeeping"
        )


_LINE = re.compile(r"^took ([0-9.]+) s:(.*)$", re.MULTILINE)
_STAGE = re.compile(r"\b([a-z_]+) ([0-9.]+) s\b")
_BEFORE_FLOW = re.compile(r"([0-9.]+) s before the flow")
_BOOKKEEPING = re.compile(r"([0-9.]+) s in Prefect's own")


def read_line(text: str) -> dict[str, float] | None:
    """The seconds in the last ``took ...`` line (``StageTimes.line``) of ``text``:
    ``took``, ``before_flow`` and ``bookkeeping`` when the line has them, and each stage by
    its name; None when ``text`` has no such line."""
    lines = _LINE.findall(text)
    if not lines:
        return None
    total, rest = lines[-1]
    seconds = {"took": float(total)}
    for key, pattern in (("before_flow", _BEFORE_FLOW), ("bookkeeping", _BOOKKEEPING)):
        if found := pattern.search(rest):
            seconds[key] = float(found.group(1))
    seconds.update({name: float(value) for name, value in _STAGE.findall(rest)})
    return seconds
