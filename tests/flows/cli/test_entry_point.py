"""The ``offmeta`` console script ends without tearing the interpreter down: what a command
printed arrives whole, through a pipe, with the command's exit status."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.helpers.paths import REPO

OFFMETA = [sys.executable, "-c", "from flows.cli import run; run()"]


def _offmeta(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [*OFFMETA, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )


def test_output_and_status_survive_the_quick_exit() -> None:
    passed = _offmeta("data", "validate", "data/samples/point_robot/heldout")
    assert passed.returncode == 0, passed.stderr
    lines = passed.stdout.splitlines()
    assert lines[0] == "data/samples/point_robot/heldout: OK"
    assert lines[-1].split() == [
        "fingerprint",
        "a823a2141180bab4d17bc446e18792dceed5b5531a608593a5a14452bdcc0769",
    ]

    refused = _offmeta("data", "validate", "no/such/dataset")
    assert refused.returncode == 1
    assert refused.stderr == (
        "offmeta data validate: source 'no/such/dataset' does not exist; expected a Parquet "
        "file, a directory or a glob\n"
    )


def test_a_command_line_error_ends_as_argparse_ends_it() -> None:
    failed = _offmeta("data", "validate", "--check-values", "sometimes", "x")
    assert failed.returncode == 2
    assert "invalid choice: 'sometimes'" in failed.stderr
