"""What a local Ray start that ran out of Ray's fixed 30 s left running is stopped before the
start is tried again; other children of the process are left alone
(``flows/process/ray_start.py``). The start here stands in for ``ray.init``: it spawns real
processes as Ray's start does, named by Ray's package path, and raises Ray's error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.process.ray_start import RAY_START_TIMEOUT, start_with_retries

pytestmark = [pytest.mark.system, pytest.mark.timeout(60)]


@pytest.fixture
def spawned() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; each still running at the end is killed."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait(timeout=10)


def _sleeper(*argv: str) -> list[str]:
    """A process that sleeps for a minute with ``argv`` on its command line."""
    return [sys.executable, "-c", "import time; time.sleep(60)", *argv]


def test_a_start_that_timed_out_is_started_again_and_its_processes_are_stopped(
    tmp_path: Path, spawned: list[subprocess.Popen[bytes]]
) -> None:
    package = tmp_path / "site-packages" / "ray"
    said: list[str] = []
    attempts: list[int] = []

    def start() -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            # What Ray's failed start leaves: its GCS and raylet, named by Ray's package path;
            # beside them, a process of someone else's started meanwhile.
            spawned.append(subprocess.Popen(_sleeper(f"{package}/core/gcs_server")))
            spawned.append(subprocess.Popen(_sleeper(f"{package}/core/raylet")))
            spawned.append(subprocess.Popen(_sleeper("prefect", "server")))
            raise Exception(f"The current node {RAY_START_TIMEOUT}. This could happen ...")

    start_with_retries(start, say=said.append, ray_package=package)

    assert attempts == [1, 2]
    gcs, raylet, other = spawned
    assert gcs.wait(timeout=10) == -9
    assert raylet.wait(timeout=10) == -9
    assert other.poll() is None
    assert len(said) == 1
    assert said[0].startswith("Ray did not start within its 30 s (1-minute load ")
    assert said[0].endswith(
        "); stopped the 2 process(es) it left and starting it again (attempt 2 of 3)"
    )
