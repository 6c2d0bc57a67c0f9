"""A permanent error in the flow, seen from the shell: ``offmeta run`` in a process of its own
ends in one line (the whole traceback with ``OFFMETA_VERBOSE=1``). Two runs that start Ray and
Prefect: the system tier."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.flow_runs import FirstRun, tiny_document, write_config

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("prefect_harness", "ray_session")]


def test_a_permanent_error_in_the_flow_ends_the_run_in_one_line(
    first_run: FirstRun, tmp_path: Path
) -> None:
    from prefect.settings import PREFECT_API_URL

    # Decided only once training starts: the published version has other layer sizes.
    wider = [
        f"artifacts.root={first_run.work / 'artifacts'}",
        "training.warm_start=true",
        "learners.modules.default_policy.model.hidden_sizes=[16]",
    ]
    config = write_config(tmp_path / "wider.yaml", tiny_document(first_run.data, tmp_path, wider))
    latest = first_run.store.get("tiny-robot@latest").spec
    refusal = (
        f"warm start from {latest}: parameter default_policy/layers.0.weight is shape "
        "[8, 2], expected shape [16, 2]; the model in learners.modules.default_policy differs "
        "from the published one (set training.warm_start to false, or publish under another "
        "artifacts.name)"
    )
    last_line = f"offmeta run: failed: ValueError: {refusal}\n"
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    env.pop("OFFMETA_VERBOSE", None)
    command = [str(Path(sys.executable).with_name("offmeta")), "run", "--config", str(config)]
    quiet = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 1
    assert "Traceback" not in quiet.stderr
    assert [line for line in quiet.stderr.splitlines() if "warm start from" in line] == [
        last_line.rstrip()
    ]

    verbose = subprocess.run(
        command, env={**env, "OFFMETA_VERBOSE": "1"}, capture_output=True, text=True, timeout=300
    )
    assert verbose.returncode == 1
    assert "Traceback (most recent call last)" in verbose.stderr
    assert verbose.stderr.endswith(last_line)
