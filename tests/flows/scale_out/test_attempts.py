"""The restart count of a Ray Train run lives in its run storage: each attempt of the worker
group creates one ``attempt-NNNN`` file or object only if nobody has (O_EXCL locally,
``If-None-Match`` on S3), so attempts counted from several nodes at once are exact."""

from __future__ import annotations

import json
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from flows.runs.run_storage import RunDir, S3Access, run_at
from flows.scale_out.worker import ATTEMPTS_DIR, record_attempt


@pytest.fixture(params=["local", "s3"])
def run(request: pytest.FixtureRequest, tmp_path: Path) -> RunDir:
    if request.param == "local":
        return run_at(tmp_path / "runs" / "run-1")
    return run_at(f"{request.getfixturevalue('s3_root')}/runs/run-1")


def test_each_attempt_adds_one_file_naming_its_process(run: RunDir) -> None:
    assert run.files(ATTEMPTS_DIR) == []
    assert [record_attempt(run) for _ in range(3)] == [0, 1, 2]
    assert run.files(ATTEMPTS_DIR) == ["attempt-0000", "attempt-0001", "attempt-0002"]
    mark = json.loads(run.read(f"{ATTEMPTS_DIR}/attempt-0001") or b"")
    assert mark == {"host": socket.gethostname(), "pid": os.getpid()}


def test_attempts_counted_at_once_are_each_counted_once(run: RunDir) -> None:
    # Each thread lists the same files and tries the same name first; one create wins.
    with ThreadPoolExecutor(max_workers=4) as pool:
        counts = sorted(pool.map(lambda _: record_attempt(run), range(8)))
    assert counts == list(range(8))
    assert run.files(ATTEMPTS_DIR) == [f"attempt-{n:04d}" for n in range(8)]


def test_create_refuses_a_file_that_exists(run: RunDir) -> None:
    assert run.create("folder/a", b"first")
    assert not run.create("folder/a", b"second")
    assert run.read("folder/a") == b"first"
    assert run.create("folder/deeper/b", b"")
    assert run.files("folder") == ["a"]  # files only, not what is in sub-folders


def test_a_worker_reaches_s3_run_storage_with_the_drivers_access(
    s3_root: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    access = S3Access.from_environment()
    location = f"{s3_root}/runs/run-2"
    # A worker node whose environment has no AWS variables at all.
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    assert record_attempt(run_at(location, access)) == 0
    assert record_attempt(run_at(location, access)) == 1
    # Ray Train shows the train loop config's values as str(): never the keys.
    assert str(access) == f"S3Access(endpoint={access.endpoint!r}, region='us-east-1')"
    assert not isinstance(access, tuple)
