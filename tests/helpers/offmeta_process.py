"""The real ``offmeta run`` of this checkout in a process of its own, for tests that kill it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.helpers.paths import REPO


def offmeta(
    work: Path,
    config: Path,
    *extra: str,
    environment: Mapping[str, str] | None = None,
    temporary_prefect: bool = False,
    command: str = "run",
) -> subprocess.Popen:
    """``offmeta COMMAND --config config *extra`` (``run`` or ``serve``) in ``work``, recording
    on the test's Prefect server (or, with ``temporary_prefect``, on the temporary server the
    run starts itself), in a process group of its own (so that what it started can be cleaned
    up after a kill, and a signal can reach the group as a Ctrl-C's does); ``environment`` adds
    to the process's variables (a cluster's, say)."""
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        **(environment or {}),
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "PREFECT_API_URL": PREFECT_API_URL.value(),
    }
    if temporary_prefect:
        del env["PREFECT_API_URL"]
    executable = str(Path(sys.executable).with_name("offmeta"))
    return subprocess.Popen(
        [executable, command, "--config", str(config), *extra],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def reap(process: subprocess.Popen) -> None:
    """Stop whatever the killed process had started (its Ray, say) in its process group."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
