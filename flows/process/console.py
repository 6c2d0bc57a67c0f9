"""What ``offmeta run`` shows on the terminal when its flow fails on a permanent error.

Prefect logs a failing task three or four times: the exception with its traceback (from
the task engine and again from the flow engine, 60 lines of engine frames) and a
``Finished in state Failed(...)`` line per task and flow run. For an error that
``flows.runs.retry_policy`` calls permanent (bad input, a setting the run cannot use) that
buries the one line that matters, which the CLI prints itself. ``permanent_failures_in_one_line``
keeps those records off the terminal: tracebacks of permanent errors are dropped at once,
``Finished in state Failed`` lines are held until the run ends and shown only when it did not
end on a permanent error. Everything else (progress, retries of transient errors with their
tracebacks) shows as before, and Prefect's API handler still sends every record to the
server. ``OFFMETA_VERBOSE=1`` (``pipeline.reads.ray_logging``) shows Prefect's output
unfiltered.

Checked against Prefect 3.9: its console handler sits on the root logger, and the state lines
are its task and flow engines' ``Finished in state ...`` messages.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

from flows.runs.retry_policy import is_permanent
from pipeline.reads.ray_logging import verbose

_FAILED_STATE = "Finished in state Failed("


class _HoldFailures(logging.Filter):
    """On one console handler: drop permanent tracebacks, hold the failed-state lines."""

    def __init__(self, handler: logging.Handler) -> None:
        super().__init__()
        self.handler = handler
        self.held: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect"):
            return True
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and is_permanent(error):
            return False
        if record.getMessage().startswith(_FAILED_STATE):
            self.held.append(record)
            return False
        return True


@contextlib.contextmanager
def permanent_failures_in_one_line() -> Iterator[None]:
    """Around a flow call (Prefect imported): keep Prefect's records of a permanent failure
    off the terminal, as the module says. The exception still propagates."""
    if verbose():
        yield
        return
    filters = [_HoldFailures(handler) for handler in logging.getLogger().handlers]
    for held in filters:
        held.handler.addFilter(held)
    error: BaseException | None = None
    try:
        yield
    except BaseException as raised:
        error = raised
        raise
    finally:
        for held in filters:
            held.handler.removeFilter(held)
            if error is None or not is_permanent(error):
                for record in held.held:
                    held.handler.handle(record)
