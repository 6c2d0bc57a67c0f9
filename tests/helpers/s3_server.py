"""A loopback S3 server for the tests: moto's standalone server in a subprocess.

Two ways to serve moto's S3 app:

- ``serial`` (what the store tests use): moto's own WSGI app and request handler under
  werkzeug's single-threaded server, so each request runs to completion before the next.
  Amazon S3 applies a conditional write atomically; moto checks ``If-None-Match`` /
  ``If-Match`` and then writes, without a lock, so only a server that handles one request
  at a time gives the store what it relies on.
- ``threaded``: ``python -m moto.server`` as shipped (one thread per request), used by the
  benchmark and by the test that shows its conditional writes are not atomic (which
  shortens the GIL switch interval so that request threads interleave often, as they
  would on many cores).

The server is started on a free port, waited for, and stopped by its pid.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.paths import REPO

OFFMETA = [sys.executable, "-c", "from flows.cli import run; run()"]
"""This checkout's ``offmeta`` command (the installed console script may be another's)."""

_SERIAL_SERVER = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication, MotoRequestHandler, create_backend_app,
)
run_simple(
    sys.argv[1], int(sys.argv[2]), DomainDispatcherApplication(create_backend_app),
    threaded=False, request_handler=MotoRequestHandler,
)
"""
# The shipped server (python -m moto.server), optionally with another GIL switch interval.
_THREADED_SERVER = """
import sys
if sys.argv[3] != "default":
    sys.setswitchinterval(float(sys.argv[3]))
from moto.server import main
main(["-H", sys.argv[1], "-p", sys.argv[2]])
"""


@contextlib.contextmanager
def moto_server(
    mode: str = "serial", *, switch_interval: float | None = None, startup_timeout: float = 60.0
) -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 and yield its endpoint URL; stop it on exit."""
    script = {"serial": _SERIAL_SERVER, "threaded": _THREADED_SERVER}[mode]
    interval = "default" if switch_interval is None else repr(switch_interval)
    with tempfile.TemporaryDirectory(prefix="offmeta-moto-") as scratch:
        log_path = Path(scratch) / "server.log"
        for _attempt in range(3):  # another process may take the free port first
            port = _free_port()
            with open(log_path, "wb") as log:
                server = subprocess.Popen(
                    [sys.executable, "-c", script, "127.0.0.1", str(port), interval],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=dict(os.environ, PYTHONUNBUFFERED="1"),
                )
            try:
                if _wait_until_listening(server, port, startup_timeout):
                    yield f"http://127.0.0.1:{port}"
                    return
                exited = server.poll()
                if exited is None:  # silent (not beaten to the port): another try would be too
                    break
            finally:
                _stop(server)
        log_tail = log_path.read_text(errors="replace")[-2000:]
        why = (
            f"did not listen on 127.0.0.1:{port} within {startup_timeout:g} s"
            if exited is None
            else f"exited with status {exited} (3 tries)"
        )
        raise RuntimeError(f"moto's S3 server ({mode}) {why}; its log ends:\n{log_tail}")


def client_environment(endpoint: str) -> dict[str, str]:
    """The standard AWS variables that point boto3 clients (and the store) at ``endpoint``."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        # Nothing from a developer's ~/.aws may point the clients elsewhere.
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }


def run_in_repo(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``argv`` in a fresh process at the repository root, importing this checkout and seeing
    the AWS variables the fixtures set, as a user's shell would run it; output as text."""
    return subprocess.run(
        argv,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_listening(server: subprocess.Popen[bytes], port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return True
        time.sleep(0.05)
    return False


def _stop(server: subprocess.Popen[bytes]) -> None:
    if server.poll() is None:
        os.kill(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
