"""Shared fixtures: one Ray session, one Prefect test harness, one loopback S3 server and one
loopback MLflow server."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator

# Set before Prefect or Ray is imported anywhere in the test process; removed as it exits.
_PREFECT_HOME = tempfile.mkdtemp(prefix="offmeta-prefect-")
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_API_DATABASE_CONNECTION_URL", "")
os.environ.setdefault("RAY_DATA_PARQUET_FOOTER_NUM_ACTORS", "1")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# MLflow clients and the test server call no telemetry host, and fail at once on a stopped one.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
if not os.environ["PREFECT_API_DATABASE_CONNECTION_URL"]:
    del os.environ["PREFECT_API_DATABASE_CONNECTION_URL"]
PREFECT_STARTUP_S = 180
"""How long the session's Prefect test server may take to answer (over a minute under load)."""

from typing import TYPE_CHECKING  # noqa: E402

import pytest  # noqa: E402

if TYPE_CHECKING:
    from tests.helpers.mlflow_server import MlflowServer


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """File by file, the files using the session's MLflow server in one process
    (``tests/helpers/scheduling.py``); other ``--dist`` modes as pytest-xdist has them."""
    if config.getoption("dist") != "loadfile":
        return None
    from tests.helpers.scheduling import SharedServerScheduling

    return SharedServerScheduling(config, log)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on the 2-core machine, two threads per process (with Ray
    workers beside them) make small meta-steps 10-20x slower, not faster."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray instance shared by every test that needs it (started again, as
    ``offmeta run`` starts it, when Ray's fixed 30 s start wait runs out under load); always
    shut down."""
    import ray

    from flows.process.ray_start import start_with_retries

    try:
        start_with_retries(
            lambda: ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        )
    except Exception as error:  # Ray's own waits (its GCS, the raylet) name no test fixture
        raise RuntimeError(
            f"the session's local Ray (ray.init, num_cpus=2) did not start: {error}"
        ) from error
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server for the whole session (it takes 10-15 s to start)."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with contextlib.ExitStack() as stack:
        # Under load (CI shares its 2 cores with nothing, a developer machine may not) the
        # server can take over a minute to start: its startup is not what the tests measure.
        try:
            stack.enter_context(prefect_test_harness(server_startup_timeout=PREFECT_STARTUP_S))
        except RuntimeError as error:  # Prefect's own says "Timed out ..." without the limit
            raise RuntimeError(
                "the session's Prefect test server (prefect_test_harness) did not answer "
                f"within {PREFECT_STARTUP_S} s: {error}"
            ) from error
        # In the environment too, as a user's PREFECT_API_URL would be: `offmeta run` then
        # checks this server instead of starting a temporary one of its own.
        before = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = PREFECT_API_URL.value()
        try:
            yield
        finally:
            if before is None:
                del os.environ["PREFECT_API_URL"]
            else:
                os.environ["PREFECT_API_URL"] = before


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """moto's S3 server on loopback for the whole session (started on first use, stopped by
    its pid at the end); boto3 clients find it through the standard AWS variables."""
    from tests.helpers.s3_server import client_environment, moto_server

    with moto_server("serial") as endpoint:
        settings = client_environment(endpoint)
        saved = {name: os.environ.get(name) for name in [*settings, "AWS_PROFILE"]}
        os.environ.pop("AWS_PROFILE", None)
        os.environ.update(settings)
        try:
            yield endpoint
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@pytest.fixture
def s3_root(s3_endpoint: str) -> str:
    """``s3://<fresh bucket>/store`` on the loopback server."""
    import uuid

    import boto3

    bucket = f"offmeta-{uuid.uuid4().hex[:16]}"
    boto3.session.Session().client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/store"


@pytest.fixture(scope="session")
def mlflow_tracking(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` (SQLite, artifacts through the server) on loopback for the session,
    started on first use (~25 s) and stopped by its pid at the end."""
    from tests.helpers.mlflow_server import mlflow_server

    with mlflow_server(tmp_path_factory.mktemp("mlflow-server")) as server:
        yield server
