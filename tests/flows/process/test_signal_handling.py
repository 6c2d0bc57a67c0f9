"""``flows.process.signals`` in this process: the first SIGINT or SIGTERM becomes
``RunInterrupted`` (later ones are ignored), each stage names itself on the way out, and the line
says how to go on. The whole runs are in tests/flows/test_signals.py (system tier)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from flows.process.signals import (
    SERVED_RUN_PROCESS,
    STARTING,
    RunInterrupted,
    ending_on_signals,
    interruptible,
    signal_number,
)
from tests.helpers.fresh_python import fresh_python_run

AGAIN = ["offmeta", "run", "--config", "my run.yaml", "--set", "training.iterations=8"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_the_first_signal_raises_later_ones_are_ignored_and_the_handlers_come_back(
    signum: int,
) -> None:
    before = signal.getsignal(signum)
    main = threading.main_thread().ident
    with pytest.raises(RunInterrupted) as caught, ending_on_signals():
        try:
            signal.pthread_kill(main, signum)
            time.sleep(60)  # cut short by the handler's exception
        finally:
            signal.pthread_kill(main, signum)  # a second one, while the first is handled
            time.sleep(0.1)  # its handler runs here, and returns
    assert (caught.value.signum, caught.value.stage) == (signum, STARTING)
    assert caught.value.exit_status == 128 + signum
    assert signal.getsignal(signum) is before


def test_a_stage_names_itself_and_its_run_directory() -> None:
    with pytest.raises(RunInterrupted) as caught, interruptible("train", run_dir="runs/abc"):
        raise RunInterrupted(signal.SIGTERM, STARTING)
    assert str(caught.value) == "SIGTERM during training"
    assert caught.value.line(AGAIN) == (
        "interrupted by SIGTERM during training: the run directory runs/abc keeps its last "
        "checkpoint; continue it with: offmeta run --config 'my run.yaml' --set "
        "training.iterations=8 --resume runs/abc"
    )


def test_the_innermost_stage_wins_and_keyboard_interrupt_is_sigint() -> None:
    with (
        pytest.raises(RunInterrupted) as caught,
        interruptible("train", run_dir=None),
        interruptible("evaluate", run_dir="runs/abc"),
    ):
        raise KeyboardInterrupt
    assert (caught.value.signum, caught.value.stage) == (signal.SIGINT, "evaluate")
    assert caught.value.exit_status == 130


def test_other_errors_pass_through_a_stage_unchanged() -> None:
    with pytest.raises(ValueError, match=r"^bad input$"), interruptible("publish", run_dir="x"):
        raise ValueError("bad input")
    assert signal_number(ValueError("bad input")) is None


def test_prefects_termination_signal_is_the_signal_it_carries() -> None:
    from prefect.exceptions import TerminationSignal

    assert signal_number(TerminationSignal(signal.SIGTERM)) == signal.SIGTERM


@pytest.mark.parametrize(
    ("stopped", "line"),
    [
        (
            RunInterrupted(signal.SIGINT, STARTING),
            "interrupted by SIGINT before the flow started: no run directory was made; start it "
            "again with: offmeta run --config 'my run.yaml' --set training.iterations=8",
        ),
        (
            RunInterrupted(
                signal.SIGTERM,
                "mirror",
                published="robot:3",
                backfill="offmeta artifacts mirror robot:3 --to mlflow --root artifacts",
            ),
            "interrupted by SIGTERM during the MLflow mirror: robot:3 is published; mirror it "
            "with: offmeta artifacts mirror robot:3 --to mlflow --root artifacts",
        ),
    ],
)
def test_the_line_says_how_to_go_on(stopped: RunInterrupted, line: str) -> None:
    assert stopped.line(AGAIN) == line


@pytest.fixture
def handlers() -> Iterator[None]:
    """Whatever a test does to the SIGINT and SIGTERM handlers is undone afterwards."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.usefixtures("handlers")
@pytest.mark.parametrize("served", [True, False], ids=["served", "not-served"])
def test_a_served_runs_process_ignores_signals_after_the_first(
    monkeypatch: pytest.MonkeyPatch, served: bool
) -> None:
    if served:
        monkeypatch.setenv(SERVED_RUN_PROCESS, "1")
    else:
        monkeypatch.delenv(SERVED_RUN_PROCESS, raising=False)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(RunInterrupted), interruptible("train", run_dir="runs/1"):
        raise KeyboardInterrupt
    after = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    assert after == (dict.fromkeys(before, signal.SIG_IGN) if served else before)


@pytest.mark.parametrize(("served", "status"), [("1", 143), ("", 0)], ids=["served", "not-served"])
def test_a_served_runs_process_a_signal_ended_leaves_with_its_status(
    served: str, status: int
) -> None:
    # In a fresh interpreter: the process leaves from an exit handler.
    code = (
        "import os, signal\n"
        f"os.environ['{SERVED_RUN_PROCESS}'] = {served!r}\n"
        "from flows.process.signals import RunInterrupted, ending_served_run\n"
        "try:\n"
        "    with ending_served_run():\n"
        "        raise RunInterrupted(signal.SIGTERM, 'train')\n"
        "except RunInterrupted:\n"
        "    print('ended')\n"
    )
    result = fresh_python_run(code, timeout=60)
    assert (result.returncode, result.stdout) == (status, "ended\n"), result.stderr
