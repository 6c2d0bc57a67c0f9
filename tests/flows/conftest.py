"""The flow tests' shared run: ``first_run``, one ``offmeta run`` of the tiny dataset per
module that asks for it, read by several tests."""

from __future__ import annotations

import contextlib
import io

import pytest

from flows.cli import main
from pipeline.artifacts import ArtifactStore
from tests.helpers.flow_runs import FirstRun, tiny_document, tiny_point_robot, write_config


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> FirstRun:
    """``offmeta run`` on the tiny dataset, once for the module."""
    data = tiny_point_robot(tmp_path_factory.mktemp("point_robot"))
    work = tmp_path_factory.mktemp("work")
    config = write_config(work / "run.yaml", tiny_document(data, work))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(["run", "--config", str(config)])
    assert status == 0, stdout.getvalue()
    store = ArtifactStore(work / "artifacts")
    return FirstRun(data, work, stdout.getvalue(), store.get("tiny-robot:1"), store)
