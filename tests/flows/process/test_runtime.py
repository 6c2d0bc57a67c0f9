"""``RayStart``: Ray started on another thread while the main one works, in a fresh process
(the test session's own Ray would be joined instead)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(180)

_PROBE = textwrap.dedent(
    """
    import threading, time
    import ray
    from flows.config import RayConfig
    from flows.process.runtime import RayStart, ray_session

    @ray.remote
    def double(x):
        return 2 * x

    with RayStart(RayConfig(num_cpus=1)) as start:
        # The main thread goes on while Ray starts; its processes must outlive the call
        # that started them (they die with the thread that started them).
        sum(i * i for i in range(10**6))
        start.wait()
        time.sleep(1.0)
        print("doubled", ray.get([double.remote(i) for i in range(3)]))
        print("keeper alive", any(t.name == "offmeta-ray-start" for t in threading.enumerate()))
        # The flow's own session joins this Ray and, as it ends, lets it stop in the
        # background while the block goes on.
        with ray_session(RayConfig()):
            print("joined", ray.get(double.remote(5)))
        deadline = time.monotonic() + 60
        while ray.is_initialized() and time.monotonic() < deadline:
            time.sleep(0.05)
        print("released", not ray.is_initialized())
    print("after", ray.is_initialized(), [t.name for t in threading.enumerate()])
    """
)


def test_ray_started_on_another_thread_serves_the_main_one_until_the_flow_releases_it():
    result = subprocess.run(
        [sys.executable, "-c", _PROBE],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "doubled [0, 2, 4]",
        "keeper alive True",
        "joined 10",
        "released True",
        "after False ['MainThread']",
    ]
    # Started off the main thread, ray.init warns that it set no SIGTERM handler: offmeta run
    # sets its own (flows.process.signals), and RayStart drops that warning.
    assert "SIGTERM handler is not set" not in result.stderr


@pytest.mark.parametrize("installed", [True, False], ids=["python-handler", "default"])
def test_ray_init_keeps_a_sigterm_handler_of_pythons(installed: bool) -> None:
    # ray.init on the main thread replaces it with sys.exit; Prefect's flow engine has one.
    import signal

    from flows.process.runtime import _sigterm_handler_kept

    def engines(signum: int, frame: object) -> None: ...

    def rays(signum: int, frame: object) -> None: ...

    before = signal.getsignal(signal.SIGTERM)
    try:
        signal.signal(signal.SIGTERM, engines if installed else signal.SIG_DFL)
        with _sigterm_handler_kept():
            signal.signal(signal.SIGTERM, rays)
        assert signal.getsignal(signal.SIGTERM) is (engines if installed else rays)
    finally:
        signal.signal(signal.SIGTERM, before)
