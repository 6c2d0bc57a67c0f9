"""SIGTERM or SIGINT ends ``offmeta serve`` within seconds, whether a run is in progress or not.

``offmeta serve`` registers its cron deployment on the test's Prefect server; a run of it is
triggered (the cron would fire at 3 am) and signalled once it trains: SIGTERM to the serving
process (``kill``, ``docker stop``), SIGINT to its process group (a Ctrl-C, which reaches the
run's own process too). The serving process exits 143 (SIGTERM) or 130 (SIGINT) within 10 s
with one line naming the interrupted flow run and the ``offmeta run --resume`` command for its
run directory; the flow run is CANCELLED or CRASHED on the server, the run directory keeps its
checkpoints and passes ``--resume``'s checks, and nothing is published."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from flows.config import load_config
from flows.runs.run_dirs import check_resumable, read_run
from pipeline.artifacts import ArtifactStore
from tests.helpers.flow_runs import tiny_document, tiny_point_robot, write_config
from tests.helpers.offmeta_process import offmeta, reap

pytestmark = [
    pytest.mark.system,
    pytest.mark.usefixtures("prefect_harness"),
    pytest.mark.timeout(900),
]

ENDS_WITHIN_S = 10
"""Seconds from the signal to the end of the serving process (issue 34)."""
SERVES_WITHIN_S = 180
"""Seconds ``offmeta serve`` may take to register its deployment (it imports Prefect and torch)."""
TRAINS_WITHIN_S = 300
"""Seconds a triggered run may take to reach the iteration the test stops it at."""


class Output:
    """The lines a process prints, read on a thread of its own, waited for with deadlines."""

    def __init__(self, process: subprocess.Popen) -> None:
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        for text in process.stdout:
            self._lines.put(text.rstrip("\n"))
        self._lines.put(None)

    def wait_for(self, pattern: re.Pattern[str], within: float, what: str) -> str:
        deadline = time.monotonic() + within
        while True:
            text = self._next(deadline, within, what)
            if text is None:
                pytest.fail(f"{what}: the process ended first:\n{self.text}")
            if pattern.search(text):
                return text

    def rest(self, within: float) -> list[str]:
        """The lines up to the end of the output, which must come within ``within`` s."""
        deadline = time.monotonic() + within
        rest: list[str] = []
        while (text := self._next(deadline, within, "the end of the output")) is not None:
            rest.append(text)
        return rest

    def _next(self, deadline: float, within: float, what: str) -> str | None:
        """The next line (None: the output ended), which must come before ``deadline``."""
        try:
            text = self._lines.get(timeout=max(deadline - time.monotonic(), 0))
        except queue.Empty:
            pytest.fail(f"{what}: not within {within} s:\n{self.text}")
        if text is not None:
            self.seen.append(text)
        return text

    @property
    def text(self) -> str:
        return "\n".join(self.seen)


def _ends(
    process: subprocess.Popen, output: Output, signum: int, log: Path, *, group: bool = False
) -> int:
    """Send ``signum`` to the serving process alone (as ``kill``, ``docker stop`` do) or, with
    ``group``, to its process group (as a Ctrl-C does), and return its exit status; ``log``
    keeps its output and how long it took to end."""
    sent = time.monotonic()
    if group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    try:
        status = process.wait(timeout=ENDS_WITHIN_S)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"offmeta serve: not ended within {ENDS_WITHIN_S} s of the signal:\n{output.text}"
        )
    took = time.monotonic() - sent
    output.rest(ENDS_WITHIN_S)
    log.write_text(f"{output.text}\nended {took:.1f} s after {signal.Signals(signum).name}\n")
    return status


def _serve(work: Path, data: Path, name: str, *overrides: str) -> tuple[subprocess.Popen, Path]:
    settings = ["artifacts.name=served-robot", "ray.num_cpus=1", "evaluation.rollout_episodes=0"]
    config = write_config(work / "serve.yaml", tiny_document(data, work, [*settings, *overrides]))
    process = offmeta(
        work,
        config,
        "--cron",
        "0 3 * * *",
        "--name",
        name,
        command="serve",
        environment={"PREFECT_RUNNER_POLL_FREQUENCY": "1"},
    )
    return process, config


def _serving(output: Output, name: str) -> None:
    output.wait_for(
        re.compile(rf"^offmeta serve: serving meta-train/{name};"),
        SERVES_WITHIN_S,
        f"offmeta serve registering meta-train/{name}",
    )


@pytest.mark.parametrize(
    ("signum", "group"),
    [(signal.SIGTERM, False), (signal.SIGINT, True)],
    ids=["sigterm-to-serve", "ctrl-c-to-the-group"],
)
def test_a_signal_ends_the_served_run_in_progress_resumable(
    tmp_path: Path, signum: int, group: bool
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    data = tiny_point_robot(tmp_path / "point_robot")
    # Long enough that the run is still training when the signal reaches it.
    training = [
        "training.iterations=100000",
        "training.log_every=20",
        "training.checkpoint_every=20",
    ]
    process, config = _serve(tmp_path, data, "signalled", *training)
    try:
        output = Output(process)
        _serving(output, "signalled")
        flow_run = run_deployment("meta-train/signalled", timeout=0)
        output.wait_for(
            re.compile(r"iteration 40/100000 "), TRAINS_WITHIN_S, "the served run at iteration 40"
        )
        status = _ends(process, output, signum, tmp_path / "serve.log", group=group)
    finally:
        reap(process)
    assert status == 128 + signum, output.text
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state.type.value
    assert state in {"CANCELLED", "CRASHED"}, output.text
    run_dir = tmp_path / "runs" / str(flow_run.id)
    signame = signal.Signals(signum).name
    assert output.seen[-1] == (
        f"offmeta serve: interrupted by {signame}: flow run {flow_run.name!r} ({flow_run.id}) "
        f"of meta-train/signalled, recorded {state}: the run directory {run_dir} keeps its last "
        f"checkpoint; continue it with: offmeta run --config {config} --resume {run_dir}"
    ), output.text
    assert read_run(run_dir).finished is None
    assert any((run_dir / "checkpoints").iterdir())
    check_resumable(read_run(run_dir), load_config(config))  # what --resume checks first
    assert ArtifactStore(tmp_path / "artifacts").list_versions("served-robot") == []


def test_sigint_ends_an_idle_serve(tmp_path: Path) -> None:
    data = tiny_point_robot(tmp_path / "point_robot")
    process, _ = _serve(tmp_path, data, "idle")
    try:
        output = Output(process)
        _serving(output, "idle")
        status = _ends(process, output, signal.SIGINT, tmp_path / "serve.log")
    finally:
        reap(process)
    assert status == 130, output.text
    assert output.seen[-1] == (
        "offmeta serve: interrupted by SIGINT: no run was in progress; no longer serving "
        "meta-train/idle"
    ), output.text
    assert not os.path.exists(tmp_path / "runs")
