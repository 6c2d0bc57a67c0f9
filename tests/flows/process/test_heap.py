"""flows.process.heap: glibc's malloc set to keep freed memory in a training process, unless
the environment says otherwise; each case in a fresh interpreter (mallopt is process-wide)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO

CALL = "from flows.process.heap import keep_freed_memory; print(keep_freed_memory())"


def _applied(**environment: str) -> subprocess.CompletedProcess[str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("OFFMETA_MALLOC", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    }
    return subprocess.run(
        [sys.executable, "-c", CALL],
        cwd=REPO,
        env={**env, **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_settings_apply_by_default_and_yield_to_the_environment() -> None:
    assert _applied().stdout.strip() == "True"
    assert _applied(OFFMETA_MALLOC="keep").stdout.strip() == "True"
    assert _applied(OFFMETA_MALLOC="system").stdout.strip() == "False"
    # glibc's own switches, set by whoever runs the process, win.
    assert _applied(MALLOC_TRIM_THRESHOLD_="131072").stdout.strip() == "False"
    assert _applied(MALLOC_MMAP_THRESHOLD_="131072").stdout.strip() == "False"


def test_an_unknown_switch_value_is_refused_by_name() -> None:
    refused = _applied(OFFMETA_MALLOC="fast")
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "ValueError: OFFMETA_MALLOC='fast': expected 'keep' or 'system'"
    )


def test_offmeta_run_refuses_an_unknown_switch_in_one_line(monkeypatch, capsys) -> None:
    from flows.cli import main

    monkeypatch.setenv("OFFMETA_MALLOC", "fast")
    assert main(["run", "--config", str(REPO / "flows" / "configs" / "point_robot.yaml")]) == 2
    assert capsys.readouterr().err == (
        "offmeta run: OFFMETA_MALLOC='fast': expected 'keep' or 'system'\n"
    )
