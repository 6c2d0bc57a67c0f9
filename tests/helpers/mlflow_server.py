"""A real MLflow tracking server for the tests: ``mlflow server`` on loopback in a subprocess.

SQLite holds runs and the registry; artifacts go to a local directory through the server
(``--artifacts-destination``: clients upload with ``mlflow-artifacts:/`` requests, as a client
on another host would). One worker, since the tests send one request at a time. The server
starts in a session of its own and is stopped by signalling that process group (its pid), which
ends the workers it spawned too. Telemetry is off (``MLFLOW_DISABLE_TELEMETRY``/``DO_NOT_TRACK``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
"""Keeps client and server from calling a telemetry host (there is no network beyond loopback)."""
FAST_FAILURE = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}
"""A client that meets a stopped server fails at once instead of retrying for minutes."""
_SERVER_ONLY = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
"""No job runner and its seven huey consumers (GenAI scorers, unused here): half the start-up."""


@dataclass
class MlflowServer:
    """A running server: its tracking URI and where it keeps its data."""

    uri: str
    root: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """End the server and its workers (the process group of its pid); waits for them."""
        if self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=20)


@contextlib.contextmanager
def mlflow_server(root: Path, *, startup_timeout: float = 180.0) -> Iterator[MlflowServer]:
    """Start ``mlflow server`` on 127.0.0.1 with its data under ``root``; stop it on exit."""
    root.mkdir(parents=True, exist_ok=True)
    log_path = root / "server.log"
    for _attempt in range(3):  # another process may take the free port first
        port = _free_port()
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [
                    *_mlflow_command(),
                    "server",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--workers",
                    "1",
                    "--backend-store-uri",
                    f"sqlite:///{root / 'mlflow.db'}",
                    "--artifacts-destination",
                    str(root / "artifacts"),
                ],
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, **QUIET, **_SERVER_ONLY, PYTHONUNBUFFERED="1"),
                start_new_session=True,
            )
        server = MlflowServer(f"http://127.0.0.1:{port}", root, process)
        try:
            if _wait_until_healthy(server, startup_timeout):
                yield server
                return
            exited = process.poll()
            if exited is None:  # silent (not beaten to the port): another try would be too
                break
        finally:
            server.stop()
    log_tail = log_path.read_text(errors="replace")[-3000:]
    why = (
        f"did not answer {server.uri}/api/2.0/mlflow/experiments/search within "
        f"{startup_timeout:g} s"
        if exited is None
        else f"exited with status {exited} (3 tries)"
    )
    raise RuntimeError(f"mlflow server {why}; its log ends:\n{log_tail}")


def unused_uri() -> str:
    """The URI of a server that is not running (nothing listens on that loopback port)."""
    return f"http://127.0.0.1:{_free_port()}"


def _mlflow_command() -> list[str]:
    """This interpreter's ``mlflow`` command (the one on PATH may be another environment's)."""
    script = Path(sys.executable).with_name("mlflow")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "mlflow"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _wait_until_healthy(server: MlflowServer, timeout: float) -> bool:
    """True once the REST API answers (``/health`` answers earlier, before the store is ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(
                f"{server.uri}/api/2.0/mlflow/experiments/search?max_results=1", timeout=5
            ) as answer:
                json.load(answer)
                return True
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.5)
    return False
