"""SIGINT and SIGTERM end ``offmeta run`` cleanly: ``ending_on_signals``, ``interruptible``,
``RunInterrupted``.

A signal becomes one exception, ``RunInterrupted``, that names the signal, the stage it
stopped and what that stage leaves behind (the run directory to resume, or the version
already published). ``ending_on_signals`` raises it on the main thread for the first SIGINT
or SIGTERM (later ones are ignored, so that a second Ctrl-C cannot cut short the recording of
the first); inside the flow Prefect's engine answers SIGTERM with its own ``TerminationSignal``
and SIGINT may arrive as ``KeyboardInterrupt``: ``interruptible`` around each stage turns all
three into ``RunInterrupted`` for that stage. Prefect's engine records the flow run (and the
task run in progress) CRASHED as the exception passes it; ``offmeta run`` then prints
``RunInterrupted.line`` and exits with ``128 + signal`` (130 for SIGINT, 143 for SIGTERM), as
shells and schedulers expect of a process a signal ended.

Checked against Prefect 3.9 (``prefect.exceptions.TerminationSignal``, raised by the SIGTERM
handler its flow engine installs for the flow's duration).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator, Sequence

SERVED_RUN_PROCESS = "OFFMETA_SERVED_RUN_PROCESS"
"""Set to 1 by ``offmeta serve`` in its environment, which the processes Prefect's runner
starts for its flow runs inherit (``ending_served_run``)."""
STARTING = "start-up"
"""The stage before the flow: checks, the Prefect API and Ray starting."""
_WHAT = {
    STARTING: "before the flow started",
    "validate": "while validating the data",
    "train": "during training",
    "evaluate": "during evaluation",
    "publish": "while publishing",
    "mirror": "during the MLflow mirror",
}


class RunInterrupted(BaseException):
    """A signal stopped the run in ``stage``. A ``BaseException``, like ``KeyboardInterrupt``:
    the stages' ``except Exception`` (retries, the mirror's outage handling) let it through."""

    def __init__(
        self,
        signum: int,
        stage: str,
        *,
        run_dir: str | None = None,
        published: str | None = None,
        backfill: str | None = None,
    ) -> None:
        super().__init__(signal.Signals(signum).name, stage)
        self.signum = signum
        self.stage = stage
        self.run_dir = run_dir
        """The run directory that ``--resume`` continues (None before it exists)."""
        self.published = published
        """The version already published (``name:version``) when the mirror was stopped."""
        self.backfill = backfill
        """The command that mirrors ``published`` later."""

    def __str__(self) -> str:  # what Prefect's CRASHED state says
        return f"{signal.Signals(self.signum).name} {_WHAT[self.stage]}"

    @property
    def exit_status(self) -> int:
        """``128 + signal``: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum

    def line(self, again: Sequence[str]) -> str:
        """What was interrupted and how to go on, in one line; ``again`` is the command that
        started the run (without ``--resume``)."""
        what = f"interrupted by {self}"
        if self.published is not None:
            return (
                f"{what}: {self.published} is published; mirror it with: "
                f"{self.backfill or 'offmeta artifacts mirror ' + self.published}"
            )
        if self.run_dir is None:
            return f"{what}: no run directory was made; start it again with: {shlex.join(again)}"
        return (
            f"{what}: the run directory {self.run_dir} keeps its last checkpoint; continue it "
            f"with: {shlex.join([*again, '--resume', self.run_dir])}"
        )


def signal_number(error: BaseException) -> int | None:
    """The signal ``error`` stands for (``RunInterrupted``, ``KeyboardInterrupt``, Prefect's
    ``TerminationSignal``), or None for any other exception."""
    if isinstance(error, RunInterrupted):
        return error.signum
    if isinstance(error, KeyboardInterrupt):
        return signal.SIGINT
    prefect_exceptions = sys.modules.get("prefect.exceptions")  # not imported: not Prefect's
    if prefect_exceptions is not None and isinstance(error, prefect_exceptions.TerminationSignal):
        return error.signal
    return None


@contextlib.contextmanager
def interruptible(
    stage: str,
    *,
    run_dir: str | None = None,
    published: str | None = None,
    backfill: str | None = None,
) -> Iterator[None]:
    """Turn a signal that stops the block into ``RunInterrupted`` for ``stage``."""
    try:
        yield
    except BaseException as error:
        signum = signal_number(error)
        if signum is None or (isinstance(error, RunInterrupted) and error.stage != STARTING):
            raise
        _served_run_ignores_later_signals()
        raise RunInterrupted(
            signum, stage, run_dir=run_dir, published=published, backfill=backfill
        ) from None


def _served_run_ignores_later_signals() -> None:
    """In a flow-run process of ``offmeta serve`` (``SERVED_RUN_PROCESS``), the first signal
    ends the run and later ones are ignored: a Ctrl-C reaches the whole process group, and the
    runner, signalled too, then SIGTERMs the run as well, which would cut short Ray's shutdown or
    the recording of the first signal's end."""
    if os.environ.get(SERVED_RUN_PROCESS) != "1":
        return
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)


@contextlib.contextmanager
def ending_on_signals() -> Iterator[None]:
    """For the block (on the main thread): the first SIGINT or SIGTERM raises
    ``RunInterrupted`` (stage ``STARTING`` until a stage says otherwise), later ones are
    ignored; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []

    def interrupt(signum: int, frame: object) -> None:
        if arrived:
            return
        arrived.append(signum)
        raise RunInterrupted(signum, STARTING)

    previous = {
        signum: signal.signal(signum, interrupt) for signum in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def ending_served_run() -> Iterator[None]:
    """In a flow-run process of ``offmeta serve`` (``SERVED_RUN_PROCESS``): when a signal ends
    the block, the process leaves as soon as its exit handlers have run, with ``128 + signal``,
    without the interpreter's teardown.

    Prefect's runner waits for that process before it records the flow run and stops (it
    looks every 3 s); the teardown of Ray, torch, pyarrow and Prefect took 6 s there (load 13),
    after the flow run's end was recorded. The exit handlers still run first: Prefect's log and
    event workers send what they hold (they drain on ``threading``'s exit hook, before
    ``atexit``'s), and ``atexit`` handlers registered after this one (none that matter are:
    Ray's session has stopped by then). Elsewhere (``offmeta run``, which leaves the same way
    after printing its line; a test calling the flow) the block changes nothing.
    """
    try:
        yield
    except BaseException as error:
        signum = signal_number(error)
        if signum is not None and os.environ.get(SERVED_RUN_PROCESS) == "1":
            atexit.register(leave_without_teardown, 128 + signum)
        raise


def leave_without_teardown(status: int) -> None:
    """End the process with ``status`` now, after flushing logging and the standard streams
    (for an exit handler: the interpreter's teardown, module and C++ static destructors of Ray,
    torch, pyarrow and Prefect, takes seconds and has nothing left to write)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
