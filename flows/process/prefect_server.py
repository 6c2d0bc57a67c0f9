"""Get the Prefect API ready while the run checks its data: ``PrefectApi``.

Without an API URL Prefect starts a temporary server (a uvicorn subprocess) when a flow
first calls its API, and the run waits the ~10 s that takes before it does anything else;
starting it also imports Prefect's whole server package into the run's process first, which
the subprocess then imports again. ``offmeta run`` starts the same subprocess itself, before
it checks the data, so the server boots on the other core while this process checks the
data and starts Ray; the flow is then pointed at it through ``PREFECT_API_URL``, and it
stops when the process exits. It runs in a process group of its own, so that a signal sent to
the run's group (Ctrl-C, ``timeout``) lets the run record its end there before it stops.

Whether a URL is configured is known at once from the environment; a URL in the active
Prefect profile only once Prefect's settings are imported (seconds, which a run refused for
its data should not pay). So the server starts unless the environment names a URL, and is
stopped again when the profile names one (``resolve``).
"""

from __future__ import annotations

import atexit
import ctypes
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from flows.process.prefect_api import API_URL_ENV, PrefectApiError, check_api_answers

STARTUP_TIMEOUT_S = 60.0
"""Seconds to wait for the temporary server's ``/health`` (Prefect's own limit is 20 s; on a
busy 2-core machine the server took 30 s beside the data checks)."""

# How Prefect 3.9 runs its temporary server (prefect.server.api.server.SubprocessASGIServer):
# its app factory under uvicorn, without the UI, marked ephemeral.
_SERVER_COMMAND = (
    "-m",
    "uvicorn",
    "--factory",
    "prefect.server.api.server:create_app",
    "--host",
    "127.0.0.1",
    "--log-level",
    "error",
    "--lifespan",
    "on",
)
_SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1"}
_PORT_IN_USE = 3
"""uvicorn's exit status when it cannot start: the port taken between choosing and binding it
(tried again, ``_STARTS`` times in all), or the app failing at start-up."""
_STARTS = 3
_PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal the kernel sends a process when the thread that started it
ends (the run's main thread, which starts the server)."""
_LOG_PREFIX = re.compile(r"^[0-9:.]+ \| [A-Z]+ +\| [\w.]+ - ")
"""Prefect's log-line prefix (time, level, logger), left out of the line quoted."""


class PrefectApi:
    """The Prefect API a run records to, made ready beside the run's own start-up.

    Creating it checks a URL set in the environment (``PrefectApiError``, one line, when
    nothing answers there) or starts a temporary server; ``resolve()`` then reads Prefect's
    profile, and ``wait()`` returns once the API answers."""

    def __init__(self) -> None:
        self.url: str | None = os.environ.get(API_URL_ENV)
        self._server: subprocess.Popen[bytes] | None = None
        self._port = 0
        if self.url is not None:
            check_api_answers(self.url)
        else:
            self._start_server()

    @property
    def temporary(self) -> bool:
        """Whether the run records to a temporary server started here."""
        return self._server is not None

    def resolve(self) -> None:
        """Use the profile's API URL if it names one (checked, and the temporary server
        stopped); imports Prefect's settings."""
        if self._server is None:
            return
        from prefect.settings import get_current_settings

        configured = get_current_settings().api.url
        if configured is not None:
            self.stop()
            self.url = configured
            check_api_answers(configured)

    def wait(self) -> None:
        """Return once the temporary server answers, then point the flow at it;
        ``PrefectApiError`` (one line) when it exits or stays silent."""
        if self._server is None:
            return
        deadline, starts = time.monotonic() + STARTUP_TIMEOUT_S, 1
        while time.monotonic() < deadline:
            status = self._server.poll()
            if status == _PORT_IN_USE and starts < _STARTS and _taken(self._port):
                self._log.close()
                self._start_server()
                starts += 1
                continue
            if status is not None:
                self._log.seek(0)
                output = self._log.read().decode(errors="replace").strip().splitlines()
                last = [_LOG_PREFIX.sub("", line) for line in output[-1:]] or ["no output"]
                self._server = None
                self._log.close()
                raise PrefectApiError(
                    f"the temporary Prefect server exited with status {status} ({last[0]}); "
                    "start one (prefect server start) and set PREFECT_API_URL"
                )
            if _answers(f"{self._url()}/health"):
                self._point_prefect_here()
                return
            time.sleep(0.1)
        self.stop()
        raise PrefectApiError(
            f"the temporary Prefect server did not answer within {STARTUP_TIMEOUT_S:g} s; "
            "start one (prefect server start) and set PREFECT_API_URL"
        )

    def stop(self) -> None:
        """Stop the temporary server (nothing to do with a configured one); runs at exit."""
        server, self._server = self._server, None
        if server is None:
            return
        server.terminate()
        try:
            server.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        finally:
            self._log.close()

    def _url(self) -> str:
        return f"http://127.0.0.1:{self._port}/api"

    def _start_server(self) -> None:
        self._port = _free_port()
        # A file, not a pipe: nobody reads a pipe while the run goes on, and a full one
        # would block the server.
        self._log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the server runs)
        self._server = subprocess.Popen(
            [sys.executable, *_SERVER_COMMAND, "--port", str(self._port)],
            env={**os.environ, **_SERVER_ENV},
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            preexec_fn=_apart_until_parent_dies,
        )
        # At exit, after Prefect's log and event workers (registered later, so run earlier)
        # have sent what they hold.
        atexit.register(self.stop)

    def _point_prefect_here(self) -> None:
        self.url = self._url()
        os.environ[API_URL_ENV] = self.url
        # It serves no UI, so the flow should not print a "View at" link to one.
        os.environ.setdefault("PREFECT_UI_URL", "")
        # The flow's client takes the URL from Prefect's global settings, read from the
        # environment when Prefect was imported: read them again.
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


def _apart_until_parent_dies() -> None:
    """In the server's process before it starts: a process group of its own, so that the
    SIGINT of a Ctrl-C or the SIGTERM that ``timeout`` sends to the run's group reach only the
    run, which records its end on this server before stopping it (``stop``, at exit); and on
    Linux a SIGTERM when the run's process dies without stopping it (SIGKILL)."""
    os.setpgid(0, 0)
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1):
            return True
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def _taken(port: int) -> bool:
    """Whether something else now listens on ``port`` (else the server failed by itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
