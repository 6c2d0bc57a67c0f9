"""``flows.process.prefect_server.PrefectApi``: the temporary Prefect server ``offmeta run``
starts beside its data checks answers, is the one the flow uses, and is gone when the
process exits; a profile's URL wins over it; a server that cannot start is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

pytestmark = pytest.mark.system  # each test starts a Prefect server of its own

# Runs in a fresh process (Prefect's settings are per process), prints what it found as JSON.
SCRIPT = """
import json, os, sys
from flows.process.prefect_server import PrefectApi
from flows.process.prefect_api import PrefectApiError
api = PrefectApi()
started = api.temporary
pid = api._server.pid if api._server is not None else None
try:
    api.resolve()
    api.wait()
except PrefectApiError as error:
    print(json.dumps({"error": str(error)}))
    sys.exit(0)
from prefect.settings import get_current_settings
print(json.dumps({
    "started": started, "temporary": api.temporary, "url": api.url, "pid": pid,
    "environment": os.environ.get("PREFECT_API_URL"),
    "prefect_url": get_current_settings().api.url,
}))
"""


def _run(tmp_path: Path, **variables: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API_")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO), **variables)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5):
            return True
    except (urllib.error.URLError, ConnectionError):
        return False


@pytest.mark.timeout(240)
def test_without_a_url_a_temporary_server_answers_prefect_uses_it_and_it_stops_at_exit(
    tmp_path: Path,
) -> None:
    found = _run(tmp_path)
    assert found["started"] and found["temporary"]
    assert found["url"].startswith("http://127.0.0.1:") and found["url"].endswith("/api")
    assert found["environment"] == found["prefect_url"] == found["url"]
    assert not Path(f"/proc/{found['pid']}").exists()  # stopped (and reaped) at exit
    assert not _answers(found["url"])


@pytest.mark.timeout(240)
def test_a_url_in_the_profile_wins_and_the_temporary_server_is_stopped(
    tmp_path: Path, prefect_harness: None
) -> None:
    from prefect.settings import PREFECT_API_URL

    harness = PREFECT_API_URL.value()
    home = tmp_path / "prefect-home"
    home.mkdir()
    (home / "profiles.toml").write_text(
        f'active = "local"\n\n[profiles.local]\nPREFECT_API_URL = "{harness}"\n'
    )
    found = _run(tmp_path)
    assert found["started"] and not found["temporary"]
    assert found["url"] == found["prefect_url"] == harness
    assert not Path(f"/proc/{found['pid']}").exists()


@pytest.mark.timeout(240)
def test_a_server_that_cannot_start_is_one_line(tmp_path: Path) -> None:
    # A database file that cannot be created: the server's start-up fails, and uvicorn exits.
    database = "sqlite+aiosqlite:////proc/no-such-folder/prefect.db"
    found = _run(tmp_path, PREFECT_API_DATABASE_CONNECTION_URL=database)
    assert found["error"] == (
        "the temporary Prefect server exited with status 3 (Application startup failed. "
        "Exiting.); start one (prefect server start) and set PREFECT_API_URL"
    )
