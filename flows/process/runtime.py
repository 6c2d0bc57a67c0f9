"""The process around a run: the Ray session, quiet defaults, the code revision."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from flows.config import RayConfig
from flows.process.ray_start import start_with_retries
from pipeline.reads.ray_logging import quiet_ray, verbose

QUIET_ENVIRONMENT = {
    # No internet on the machines this runs on, and nobody asked for telemetry.
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    # One Parquet footer-reader actor instead of one per CPU (see DESIGN.md, measured facts).
    "RAY_DATA_PARQUET_FOOTER_NUM_ACTORS": "1",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    # Ray frees released objects in batches, by default once a second: a stream consumes
    # 150-400 MB of blocks in that second, and that memory stays taken (and mapped into
    # the driver) until the batch goes. Measured: peak driver RSS streaming 5M rows,
    # 520-620 MiB at 100 ms, 670-790 MiB at the default. Applies to a Ray that offmeta
    # starts; a cluster keeps its own setting.
    "RAY_free_objects_period_milliseconds": "100",
}
"""Environment defaults of ``offmeta run``/``serve``; variables already set win."""


def set_quiet_environment() -> None:
    """Apply ``QUIET_ENVIRONMENT`` where unset; call before importing Prefect or Ray."""
    for name, value in QUIET_ENVIRONMENT.items():
        os.environ.setdefault(name, value)


@contextlib.contextmanager
def ray_session(config: RayConfig) -> Iterator[None]:
    """Join the running Ray session, or start (and afterwards stop) one as ``config`` says.

    A session that was already running (a test fixture, a notebook) is left running, except
    one that ``offmeta run`` started for this block (``RayStart``): leaving the block lets it
    stop in the background while Prefect finishes the flow run. Ray's output is silenced as
    for library use (``pipeline.reads.ray_logging``; ``OFFMETA_VERBOSE=1`` shows it, and the
    output of Ray's workers too).
    """
    import ray

    quiet_ray()
    if ray.is_initialized():
        try:
            yield
        finally:
            if _started_for_the_flow is not None:
                _started_for_the_flow.release()
        return
    _init_ray(config)
    try:
        yield
    finally:
        ray.shutdown()


class RayStart:
    """Ray starting in the background, for ``offmeta run``: entered once the run's checks
    have passed, it starts Ray (unless a session is running) while the process goes on to
    import Prefect and the flow; ``wait()`` returns once Ray is up, and leaving the block
    stops the Ray it started (after waiting for its start to end, on every path).

    ``ray.init`` takes ~6 s on the 2-core machine, most of it waiting for Ray's processes
    (GCS, raylet, the API server) to come up, so another thread can do it while the main
    thread works. That thread lives until the session stops, and stops it: Ray's processes get
    a parent-death signal, which Linux sends when the *thread* that started them ends. The
    flow's ``ray_session`` releases it as it ends (``release``), so that its 1-2 s of shutdown
    overlap Prefect's own end of the flow run.
    """

    def __init__(self, config: RayConfig) -> None:
        self._config = config
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    def __enter__(self) -> RayStart:
        import ray

        from pipeline.ray_compat import drop_off_main_thread_warning

        quiet_ray()
        if ray.is_initialized():
            self._ready.set()
            return self
        drop_off_main_thread_warning()
        self._keeper = threading.Thread(target=self._keep, name="offmeta-ray-start", daemon=True)
        self._keeper.start()
        global _started_for_the_flow
        _started_for_the_flow = self
        return self

    def _keep(self) -> None:
        import ray

        try:
            _init_ray(self._config)
        except BaseException as error:  # raised again on the main thread by wait()
            self._error = error
            return
        finally:
            self._ready.set()
        self._stop.wait()
        ray.shutdown()

    def release(self) -> None:
        """Stop the Ray this started, in the background: nothing here uses it any more."""
        global _started_for_the_flow
        if _started_for_the_flow is self:
            _started_for_the_flow = None
        self._stop.set()

    def wait(self) -> None:
        """Return once Ray is up; raises what ``ray.init`` raised."""
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def __exit__(self, *exc_info: object) -> None:
        if self._keeper is None:
            return
        self.release()
        self._keeper.join()


_started_for_the_flow: RayStart | None = None
"""The ``RayStart`` whose Ray the flow's ``ray_session`` releases as it ends."""


def _init_ray(config: RayConfig) -> None:
    """Start (or join, with ``config.address``) Ray; a local start that runs out of Ray's
    fixed 30 s on a loaded machine is tried again (``flows.process.ray_start``)."""
    import ray

    quiet = not verbose()

    def start() -> None:
        ray.init(
            # "local" starts a fresh instance even if `ray start` left a cluster address behind.
            address=config.address or "local",
            num_cpus=config.num_cpus,
            runtime_env=config.runtime_env,
            include_dashboard=False,
            log_to_driver=not quiet,
            logging_level=logging.WARNING if quiet else logging.INFO,
        )

    with _sigterm_handler_kept():
        if config.address in (None, "local"):
            start_with_retries(start)
        else:
            start()


@contextlib.contextmanager
def _sigterm_handler_kept() -> Iterator[None]:
    """Keep the SIGTERM handler of the main thread across the block, if Python code had set
    one.

    ``ray.init`` on the main thread replaces it with ``sys.exit(15)`` (Ray 2.60). Where the flow
    runs in a process of Prefect's (``offmeta serve``'s runner, a work-pool worker), the flow
    engine's handler is there, which turns SIGTERM into ``TerminationSignal``: the stage in
    progress then ends as ``RunInterrupted`` and the flow run is recorded CRASHED, while
    ``SystemExit(15)`` would pass every stage as an unexplained exit. Without a handler of
    Python's (a plain script) Ray's stays, so its exit handlers still stop it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` torch intra-op threads (None: unchanged)."""
    import torch

    if threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def code_version(directory: str | Path | None = None) -> str | None:
    """``git rev-parse HEAD`` of the code's checkout (``+dirty`` with uncommitted changes to
    tracked files); None outside a git checkout or without git."""
    where = Path(directory) if directory is not None else Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    dirty = "+dirty" if status.returncode == 0 and status.stdout.strip() else ""
    return head.stdout.strip() + dirty
