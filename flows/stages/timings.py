"""How long each stage of a run took (``StageTimes``), for the one line ``offmeta run``
ends with and for ``bench/startup.py``."""

from __future__ import annotations

import contextlib
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
