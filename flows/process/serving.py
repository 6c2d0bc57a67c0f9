"""``offmeta serve``: the ``meta_train`` deployment served by Prefect's runner until SIGINT or
SIGTERM, which end it within seconds: ``serve``, ``ServeInterrupted``.

Prefect 3.9's ``Runner`` (``flow.serve`` builds one) runs each flow run in a child process
(``multiprocessing`` spawn) and answers SIGTERM itself (``Runner.handle_sigterm``, installed by
``Runner.start``): it stops polling, and for each run in progress it sends its cancel intent
over its control channel, SIGTERMs the child, looks every 3 s whether it has ended (SIGKILL
after 30 s), records the flow run CANCELLED and pauses the deployment's schedule. Here SIGINT
means the same (under ``flow.serve`` it ends asyncio's run of the runner, and no run is recorded
CANCELLED), the first signal is remembered for the exit status and the line, and later ones are
ignored, so that a second Ctrl-C cannot cut short the recording of the first. In the child, the
stage in progress ends as ``RunInterrupted`` within a second of the SIGTERM (the flow engine's
SIGTERM handler survives ``ray.init``: ``flows.process.runtime``), and once the flow run's end
is recorded the process leaves without the interpreter's teardown
(``flows.process.signals.ending_served_run``), so that one of the runner's first looks finds it
gone.

``serve`` returns the exit status: 130 or 143 after a signal, with one line per interrupted run
naming the flow run, the state it was recorded in and the ``offmeta run --resume`` command that
continues its run directory (or one line saying that no run was in progress).

Checked against Prefect 3.9.1 (``Runner.handle_sigterm``, ``Runner.astop``,
``Runner.execute_in_background``; the runner's ``stopping`` flag, which its own handler sets).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from typing import Any

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    DeploymentFilter,
    DeploymentFilterId,
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
)
from prefect.client.schemas.objects import FlowRun, StateType
from prefect.runner import Runner

from flows.config import MetaTrainConfig
from flows.process.signals import SERVED_RUN_PROCESS
from flows.runs.run_dirs import RunRecord, list_runs
from flows.stages.mirroring import backfill_command

_IN_PROGRESS = [StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]


class ServeInterrupted(BaseException):
    """A signal arrived before the runner was serving (while the deployment was registered)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Runner(Runner):
    """Prefect's runner, stopped the same way by SIGINT as by SIGTERM, once; it remembers the
    signal and the deployment's flow runs that were in progress when it arrived."""

    def __init__(self, *args: Any, announce: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deployment_id: Any = None
        self.signum: int | None = None
        self.interrupted: list[FlowRun] = []
        self._announce = announce

    async def __aenter__(self) -> _Runner:
        await super().__aenter__()
        # Started now: from here on a signal stops the runner (before, it ends the process).
        print(self._announce, file=sys.stderr)
        return self

    def handle_sigterm(self, signum: int = signal.SIGTERM, frame: object = None) -> None:
        if self.signum is not None:
            return
        self.signum = signum
        if not self.started or self.stopping:
            raise ServeInterrupted(signum)
        self.stopping = True
        self.execute_in_background(self._stop_serving)

    async def _stop_serving(self) -> None:
        async with get_client() as client:
            self.interrupted = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(
                    id=DeploymentFilterId(any_=[self.deployment_id])
                ),
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(type=FlowRunFilterStateType(any_=_IN_PROGRESS))
                ),
            )
        await self.astop()


def serve(
    flow: Flow[..., Any],
    cfg: MetaTrainConfig,
    *,
    name: str,
    again: Sequence[str],
    **deployment: Any,
) -> int:
    """Serve ``flow`` as the deployment ``name`` (``deployment``: ``Runner.add_flow``'s
    schedules, parameters, description, entrypoint type) until SIGINT or SIGTERM, and return
    the exit status; ``again`` is the ``offmeta run`` command of ``cfg``, without ``--resume``."""
    label = f"{flow.name}/{name}"
    runner = _Runner(
        name=name,
        limit=deployment.pop("limit"),
        pause_on_shutdown=True,
        announce=f"offmeta serve: serving {label}; trigger a run with: prefect deployment run "
        f"{label}",
    )
    previous = {s: signal.signal(s, runner.handle_sigterm) for s in (signal.SIGINT, signal.SIGTERM)}
    os.environ[SERVED_RUN_PROCESS] = "1"  # inherited by the runner's flow-run processes
    try:
        runner.deployment_id = runner.add_flow(flow, name=name, **deployment)
        # Runner.start installs runner.handle_sigterm for SIGTERM again, on the main thread;
        # SIGINT keeps it too, since asyncio.run leaves a handler that is not Python's default.
        asyncio.run(runner.start())
    except ServeInterrupted as stop:
        print(
            f"offmeta serve: interrupted by {signal.Signals(stop.signum).name} before serving "
            f"{label} began; no run was started",
            file=sys.stderr,
        )
        return 128 + stop.signum
    finally:
        del os.environ[SERVED_RUN_PROCESS]
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if runner.signum is None:
        print(f"offmeta serve: stopped serving {label}", file=sys.stderr)
        return 0
    signame = signal.Signals(runner.signum).name
    if not runner.interrupted:
        print(
            f"offmeta serve: interrupted by {signame}: no run was in progress; no longer "
            f"serving {label}",
            file=sys.stderr,
        )
    records = list_runs(cfg.training.checkpoint_dir) if runner.interrupted else []
    for flow_run in runner.interrupted:
        line = _line(signame, flow_run, label, records, cfg, again)
        print(f"offmeta serve: {line}", file=sys.stderr)
    return 128 + runner.signum


def _line(
    signame: str,
    flow_run: FlowRun,
    label: str,
    records: list[RunRecord],
    cfg: MetaTrainConfig,
    again: Sequence[str],
) -> str:
    """What the signal did to ``flow_run`` and how to go on, in one line."""
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    recorded = state.type.value if state is not None else "no state"
    what = (
        f"interrupted by {signame}: flow run {flow_run.name!r} ({flow_run.id}) of {label}, "
        f"recorded {recorded}"
    )
    record = next((r for r in records if str(flow_run.id) in r.flow_run_ids()), None)
    if record is None:
        return f"{what}: no run directory was made; the next run of {label} starts afresh"
    if record.finished is not None:
        published = record.finished["artifact"]
        if cfg.artifacts.mlflow is None:
            return f"{what}: {published} is published"
        backfill = backfill_command(cfg, published)
        return f"{what}: {published} is published; mirror it with: {backfill}"
    resume = shlex.join([*again, "--resume", str(record.path)])
    return (
        f"{what}: the run directory {record.path} keeps its last checkpoint; continue it with: "
        f"{resume}"
    )
