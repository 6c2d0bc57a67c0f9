"""Python code run in a fresh interpreter of this checkout: for tests of what importing or
calling something loads (the test process has loaded everything already)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import REPO


def fresh_python(code: str, *, timeout: float = 100) -> str:
    """Run ``code`` with ``python -c`` in the repository; its standard output, stripped (an
    exit status other than 0 fails the test with the process's standard error)."""
    result = fresh_python_run(code, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def fresh_python_run(code: str, *, timeout: float = 100) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``python -c`` in the repository, whatever its exit status."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
