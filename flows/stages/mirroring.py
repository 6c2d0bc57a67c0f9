"""Stage 5 of a run with ``artifacts.mlflow`` set: mirror the published version to MLflow.

The offmeta version is committed before this stage starts and nothing here can undo it: an
MLflow outage is tried ``artifacts.mlflow.attempts`` times, all of them within
``artifacts.mlflow.timeout_s``, then reported (a log line, the Prefect report and ``offmeta
run``'s last line) as *not mirrored*, with the command that backfills it later; the run still
succeeds. ``pipeline.mlflow.mirror`` does the mirroring.

MLflow's client retries a failed request up to 7 times with backoff and waits 120 s for an
answer (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``): one try at a
stopped server took 4 min. Here each request is made once (the attempts are the retries) with
the seconds left as its timeout, and each attempt runs on a thread of its own that the stage
stops waiting for at the deadline, since a server that answers slowly request by request could
otherwise outlast it. Such a thread is left to end on its own (its requests time out by the
same deadline); it never un-publishes anything, and a later mirror finds what it registered.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from flows.config import MetaTrainConfig
from pipeline.artifacts import ArtifactRef, ArtifactStore

_T = TypeVar("_T")
_MAX_RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
_TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_WAIT_SLICE_S = 0.2


@dataclass(frozen=True)
class MirrorOutcome:
    """How the mirror of one published version went."""

    spec: str
    """offmeta ``name:version``."""
    mirrored: bool
    detail: str
    """What MLflow now holds (``MirrorResult.summary``), or the last error."""
    attempts: int
    backfill: str
    """The command that mirrors the version later."""

    def line(self) -> str:
        """One line for the log and ``offmeta run``."""
        if self.mirrored:
            return f"mirrored to MLflow: {self.detail}"
        tries = f"{self.attempts} attempt{'s' * (self.attempts != 1)}"
        return (
            f"not mirrored to MLflow: {self.spec} is published in offmeta, but the mirror failed "
            f"after {tries} ({self.detail}); backfill it with: {self.backfill}"
        )


def mirror_published(
    cfg: MetaTrainConfig, ref: ArtifactRef, *, logger: logging.Logger | logging.LoggerAdapter
) -> MirrorOutcome:
    """Mirror ``ref`` (and the unmirrored versions before it) to ``cfg.artifacts.mlflow``,
    retrying until ``attempts`` or ``timeout_s`` run out; never raises for what MLflow or its
    client does."""
    settings = cfg.artifacts.mlflow
    if settings is None:
        raise ValueError("mirror_published needs artifacts.mlflow in the config")
    registered_model = cfg.artifacts.registered_model or cfg.artifacts.name
    backfill = backfill_command(cfg, ref)
    deadline = time.monotonic() + settings.timeout_s
    where = settings.tracking_uri or "$MLFLOW_TRACKING_URI"
    logger.info("mirroring %s to MLflow at %s (within %g s)", ref, where, settings.timeout_s)
    detail, attempt = "", 0
    # Outside the try: its except clauses name MirrorError (mlflow itself is imported by
    # mirror(), so a missing client still counts as a failed attempt).
    from pipeline.mlflow.mirror import MirrorError, MlflowTarget, mirror

    for attempt in range(1, settings.attempts + 1):
        try:
            target = MlflowTarget.resolve(
                settings.tracking_uri, settings.experiment, registered_model
            )
            store = ArtifactStore(cfg.artifacts.root)
            result = _before(deadline, functools.partial(mirror, store, str(ref), target))
        except _OutOfTime:
            detail = (
                f"no answer from MLflow within {settings.timeout_s:g} s "
                "(artifacts.mlflow.timeout_s)"
            )
            break
        except ModuleNotFoundError as error:
            detail = f"{error}; install the client with: pip install 'offmeta[mlflow]'"
            break
        except MirrorError as error:
            detail = str(error)  # the same request would be refused again
            break
        except Exception as error:  # an MLflow outage in any shape: the publish stands
            detail = f"{type(error).__name__}: {_first_line(error)}"
            logger.warning(
                "mirror of %s to MLflow, attempt %d of %d, failed: %s",
                ref,
                attempt,
                settings.attempts,
                detail,
            )
            if attempt < settings.attempts:
                if time.monotonic() + settings.retry_delay_s >= deadline:
                    break  # no time left for another attempt
                time.sleep(settings.retry_delay_s)
        else:
            outcome = MirrorOutcome(str(ref), True, result.summary(), attempt, backfill)
            logger.info("%s", outcome.line())
            return outcome
    outcome = MirrorOutcome(str(ref), False, detail, attempt, backfill)
    logger.error("%s", outcome.line())
    return outcome


def backfill_command(cfg: MetaTrainConfig, ref: ArtifactRef | str) -> str:
    """The ``offmeta artifacts mirror`` command that mirrors ``ref`` to ``artifacts.mlflow``."""
    settings = cfg.artifacts.mlflow
    if settings is None:
        raise ValueError("backfill_command needs artifacts.mlflow in the config")
    command = ["offmeta", "artifacts", "mirror", str(ref), "--to", "mlflow"]
    command += ["--root", cfg.artifacts.root, "--experiment", settings.experiment]
    command += ["--registered-model", cfg.artifacts.registered_model or cfg.artifacts.name]
    command += ["--tracking-uri", settings.tracking_uri] if settings.tracking_uri else []
    return shlex.join(command)


def mirror_markdown(outcome: MirrorOutcome, tracking_uri: str | None) -> str:
    """The Prefect report of the mirror."""
    server = tracking_uri or "$MLFLOW_TRACKING_URI"
    if outcome.mirrored:
        return "\n".join(
            [
                f"# {outcome.spec} in MLflow",
                "",
                f"Mirrored to the MLflow server `{server}`: {outcome.detail}.",
            ]
        )
    return "\n".join(
        [
            f"# {outcome.spec}: not mirrored to MLflow",
            "",
            f"The version is published in the offmeta store (the source of truth); the mirror "
            f"to `{server}` failed after {outcome.attempts} attempt(s): {outcome.detail}",
            "",
            f"Backfill it (idempotent) with `{outcome.backfill}`.",
        ]
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else "(no message)"


class _OutOfTime(Exception):
    """The mirror's deadline passed before an attempt ended."""


def _before(deadline: float, call: Callable[[], _T]) -> _T:
    """``call()`` on a thread of its own with MLflow's requests bounded by ``deadline``
    (``time.monotonic``); its result or error, or ``_OutOfTime`` once the deadline passes."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _OutOfTime
    outcome: dict[str, object] = {}

    def attempt() -> None:
        # The bound lasts as long as the thread, which may outlive the wait below.
        with _requests_within(left):
            try:
                outcome["result"] = call()
            except BaseException as error:  # raised again on the waiting thread
                outcome["error"] = error

    worker = threading.Thread(target=attempt, name="offmeta-mlflow-mirror", daemon=True)
    worker.start()
    # In short waits: a signal that another thread of the process receives only runs its
    # handler here once the main thread's wait ends (a SIGTERM must end the run in seconds).
    while worker.is_alive() and (remaining := deadline - time.monotonic()) > 0:
        worker.join(min(remaining, _WAIT_SLICE_S))
    if worker.is_alive():
        raise _OutOfTime
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


@contextlib.contextmanager
def _requests_within(seconds: float) -> Iterator[None]:
    """MLflow's client sends each request once, waiting at most ``seconds`` (rounded up: it
    takes whole seconds) or the ``MLFLOW_HTTP_REQUEST_TIMEOUT`` the environment sets if that
    is shorter; both variables are read by the client at every request."""
    previous = {name: os.environ.get(name) for name in (_MAX_RETRIES_ENV, _TIMEOUT_ENV)}
    timeout = max(1, math.ceil(seconds))
    configured = previous[_TIMEOUT_ENV]
    if configured is not None and configured.isdigit():
        timeout = min(timeout, int(configured))
    os.environ[_MAX_RETRIES_ENV] = "0"
    os.environ[_TIMEOUT_ENV] = str(timeout)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
