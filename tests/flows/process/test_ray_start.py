"""Which errors of a local Ray start are tried again, and how often
(``flows/process/ray_start.py``; what a failed start leaves is stopped:
``test_ray_start_cleanup.py``, a system test). The start here stands in for ``ray.init``: a
second local Ray cannot start inside the test session's."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.process.ray_start import RAY_START_TIMEOUT, start_with_retries

pytestmark = pytest.mark.timeout(60)

RAY_ERROR = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)


def test_other_errors_are_raised_at_once() -> None:
    calls: list[int] = []

    def start() -> None:
        calls.append(1)
        raise ConnectionError("Failed to connect to Ray cluster at 127.0.0.1:6379")

    with pytest.raises(ConnectionError, match="Failed to connect to Ray cluster"):
        start_with_retries(start, say=pytest.fail)
    assert calls == [1]


def test_the_last_attempts_timeout_is_raised() -> None:
    said: list[str] = []

    def start() -> None:
        raise Exception(RAY_ERROR)

    with pytest.raises(Exception, match=RAY_START_TIMEOUT):
        start_with_retries(start, attempts=3, say=said.append)
    assert [line[-16:] for line in said] == ["(attempt 2 of 3)", "(attempt 3 of 3)"]


def test_the_processes_of_a_failed_start_are_told_by_the_installed_ray_package() -> None:
    import ray

    from flows.process.ray_start import _installed_ray

    assert _installed_ray() == Path(ray.__file__).parent
