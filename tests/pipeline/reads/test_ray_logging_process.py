"""Library use is quiet: reading and streaming episodes from Python in a fresh process (which
starts a Ray of its own) prints nothing of Ray's machinery, and ``OFFMETA_VERBOSE=1`` brings
Ray's own output back."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pipeline.reads.ray_logging import VERBOSE_ENV
from tests.helpers.paths import REPO

pytestmark = pytest.mark.system

# What a user's script does: read a dataset and take a few minibatches, Ray not started.
READ = """
from pipeline.reads.episodes import read_episodes
from pipeline.streams.learner_stream import split_for_learners

episodes = read_episodes("data/samples/point_robot/train")
[stream] = split_for_learners(episodes, 1, minibatch_size=512, seed=0)
with stream:
    batches = list(stream.take(2))
print("read", len(batches), "batches")
"""
RAY_NOISE = ("INFO", "Token authentication", "tqdm", "Running Dataset")


def _read(**extra: str) -> subprocess.CompletedProcess[str]:
    # As in a user's shell: RAY_AUTH_MODE unset (a Ray started by an earlier test of this
    # process sets it, and then Ray has no token warning to give).
    env = {k: v for k, v in os.environ.items() if k not in (VERBOSE_ENV, "RAY_AUTH_MODE")}
    env |= extra
    return subprocess.run(
        [sys.executable, "-c", READ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(300)
def test_reading_from_python_prints_nothing_of_rays_machinery() -> None:
    done = _read()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "read 2 batches\n"
    noise = [line for line in done.stderr.splitlines() if any(n in line for n in RAY_NOISE)]
    assert noise == []


@pytest.mark.timeout(300)
def test_offmeta_verbose_brings_rays_output_back() -> None:
    done = _read(**{VERBOSE_ENV: "1"})
    assert done.returncode == 0, done.stderr
    assert "read 2 batches" in done.stdout
    output = done.stdout + done.stderr
    assert "INFO worker.py" in output and "Started a local Ray instance." in output
    assert "Token authentication is enabled for this Ray cluster" in output
