"""The process around a run: the Ray session, quiet defaults, the code revision."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

from flows.config import RayConfig
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

    A session that was already running (a test fixture, a notebook) is left running. Ray's
    output is silenced as for library use (``pipeline.reads.ray_logging``; ``OFFMETA_VERBOSE=1``
    shows it, and the output of Ray's workers too).
    """
    import ray

    quiet_ray()
    if ray.is_initialized():
        yield
        return
    quiet = not verbose()
    ray.init(
        # "local" starts a fresh instance even if `ray start` left a cluster address behind.
        address=config.address or "local",
        num_cpus=config.num_cpus,
        runtime_env=config.runtime_env,
        include_dashboard=False,
        log_to_driver=not quiet,
        logging_level=logging.WARNING if quiet else logging.INFO,
    )
    try:
        yield
    finally:
        ray.shutdown()


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
