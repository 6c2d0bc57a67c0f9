"""``offmeta run`` (one meta-training run now) and ``offmeta serve`` (on a cron schedule).

Both take ``--config FILE`` and any number of ``--set KEY=VALUE`` overrides; the config is
validated before Prefect, Ray or torch is imported, so a typo costs a second, not a Ray
start-up. ``run`` also checks both datasets against each other and the config
(``flows.stages.datasets.inspect_datasets``, the checks of ``offmeta data validate``)
and builds the networks of ``model.factory`` and ``model.encoder: conv`` once
before it starts Ray or the flow (a factory's output is checked against its head on a dummy
batch, and a layer known to vmap wrongly is refused: ``learners.meta.vectorized_check``).
Without an API URL the run records to a temporary Prefect server, which boots in its own
process while those checks run (``flows.process.prefect_server``), and Ray starts on another
thread once they have passed (``flows.process.runtime.RayStart``); with ``PREFECT_API_URL``
set, that server must answer (``flows.process.prefect_api``) before anything else happens.
The run ends with the seconds each stage took (``flows.stages.timings``).

SIGINT or SIGTERM at any stage ends the run within seconds (``flows.process.signals``): the
flow run is recorded CRASHED, the run directory keeps its last checkpoint, and one line says
what was stopped and the ``--resume`` command that continues it; the exit status is 130
(SIGINT) or 143 (SIGTERM).

A run that fails on a permanent error (``flows.runs.retry_policy``) ends with one line, not
Prefect's tracebacks (``flows.process.console``; ``OFFMETA_VERBOSE=1`` shows them).

``offmeta run --resume [RUN_DIR]`` continues an unfinished run (``flows.runs.run_dirs``); the run
directory is found and checked before anything starts.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from flows.config import ConfigError, MetaTrainConfig, load_config
from flows.process.console import permanent_failures_in_one_line
from flows.process.heap import keep_freed_memory
from flows.process.prefect_api import PrefectApiError, check_api_answers, prefect_api_url
from flows.process.prefect_server import PrefectApi
from flows.process.runtime import RayStart, set_quiet_environment
from flows.process.signals import STARTING, RunInterrupted, ending_on_signals, interruptible
from flows.runs.run_dirs import RunDirError, check_resumable, find_resumable, read_run

if TYPE_CHECKING:
    from prefect.client.schemas.schedules import CronSchedule

_NEWEST = "\0newest"
"""``--resume`` without a value: not a path anybody can type."""


def register(subparsers: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", required=True, help="YAML run config (see flows/configs/)")
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set learners.inner.lr=0.05 (repeatable; "
        "VALUE is parsed as YAML)",
    )

    run = subparsers.add_parser(
        "run",
        parents=[common],
        help="meta-train, evaluate and publish once",
        description="Run the meta_train flow once: validate the data, meta-train, evaluate "
        "on held-out tasks, publish a new artifact version. Prints the evaluation table and "
        "the published reference.",
    )
    run.add_argument(
        "--resume",
        nargs="?",
        const=_NEWEST,
        metavar="RUN_DIR",
        help="continue an unfinished run (killed, or failed) from its last checkpoint: the "
        "newest one of this config under training.checkpoint_dir, or the run directory "
        "RUN_DIR; it ends as the run would have ended uninterrupted",
    )
    run.set_defaults(handler=_run)

    serve = subparsers.add_parser(
        "serve",
        parents=[common],
        help="serve the meta_train flow as a deployment, on a cron schedule",
        description="Register a 'meta-train/NAME' deployment with the config as its "
        "parameters and run its scheduled (or manually triggered) runs in this process until "
        "interrupted (Ctrl-C or SIGTERM). Needs a Prefect server (PREFECT_API_URL); --cron "
        "without one is refused.",
    )
    serve.add_argument(
        "--cron",
        help='cron schedule, e.g. "0 3 * * *" (3 am daily); without it runs start only '
        "when triggered (prefect deployment run meta-train/NAME)",
    )
    serve.add_argument("--timezone", default="UTC", help="timezone of --cron (default UTC)")
    serve.add_argument("--name", help="deployment name (default: artifacts.name of the config)")
    serve.add_argument("--limit", type=int, default=1, help="runs at the same time (default 1)")
    serve.set_defaults(handler=_serve)


def _run(args: argparse.Namespace) -> int:
    cfg = _load(args, "run")
    if cfg is None:
        return 2
    try:
        resume = _resume_dir(args.resume, cfg)
    except RunDirError as error:
        print(f"offmeta run: --resume: {error}", file=sys.stderr)
        return 2
    began = time.perf_counter()
    set_quiet_environment()
    try:
        keep_freed_memory()
    except ValueError as error:
        print(f"offmeta run: {error}", file=sys.stderr)
        return 2
    try:
        with ending_on_signals(), interruptible(STARTING, run_dir=resume):
            # Prefect's temporary server takes ~10 s to boot and Ray a few: both start while
            # the data is checked, instead of one after the other inside the flow.
            try:
                prefect = PrefectApi()
            except PrefectApiError as error:
                print(f"offmeta run: {error}", file=sys.stderr)
                return 1
            return _run_when_ready(cfg, resume, prefect, began)
    except RunInterrupted as stop:
        print(f"offmeta run: {stop.line(_command(args))}", file=sys.stderr)
        return stop.exit_status


def _run_when_ready(
    cfg: MetaTrainConfig, resume: str | None, prefect: PrefectApi, began: float
) -> int:
    if not _data_fits(cfg) or not _networks_build(cfg):
        return 1
    # Ray starts on another thread while this one imports Prefect and the flow.
    with RayStart(cfg.ray) as ray_start:
        try:
            prefect.resolve()
        except PrefectApiError as error:
            print(f"offmeta run: {error}", file=sys.stderr)
            return 1
        from flows.meta_train import meta_train

        try:
            prefect.wait()
        except PrefectApiError as error:
            print(f"offmeta run: {error}", file=sys.stderr)
            return 1
        ray_start.wait()
        before_flow = time.perf_counter() - began
        try:
            with permanent_failures_in_one_line():
                summary = meta_train(cfg, resume=resume)
        except Exception as error:  # a permanent one is this line alone; others follow Prefect's
            print(f"offmeta run: failed: {type(error).__name__}: {error}", file=sys.stderr)
            return 1
    if resume is not None:
        print(f"resumed {summary.run_dir} at iteration {summary.resumed_from or 0}")
    print()
    print(summary.evaluation.format())
    print()
    print(summary.timings.line(before_flow, time.perf_counter() - began))
    lineage = f" (parent {summary.parent})" if summary.parent else ""
    print(f"published {summary.artifact}{lineage}: {summary.uri}")
    if summary.mirror is not None:
        print(summary.mirror)
    return 0


def _serve(args: argparse.Namespace) -> int:
    cfg = _load(args, "serve")
    if cfg is None:
        return 2
    set_quiet_environment()
    try:
        schedule = _schedule(args.cron, args.timezone)
    except ValueError as error:
        print(f"offmeta serve: {error}", file=sys.stderr)
        return 2
    url = prefect_api_url()
    if schedule is not None and not url:
        # Without a server Prefect serves from a temporary one, which runs no scheduler:
        # the process would wait for a run that is never created.
        print(
            "offmeta serve: --cron needs a Prefect server, but PREFECT_API_URL is not set, so "
            "Prefect would start a temporary server that runs no scheduler and the schedule "
            "would never fire; start one (prefect server start) and set PREFECT_API_URL "
            "(e.g. http://127.0.0.1:4200/api)",
            file=sys.stderr,
        )
        return 1
    if not _api_answers("serve", url):
        return 1
    from prefect.deployments.runner import EntrypointType

    from flows.meta_train import meta_train
    from flows.process.serving import serve

    return serve(
        meta_train,
        cfg,
        name=args.name or cfg.artifacts.name,
        again=_command(args),
        schedules=[schedule] if schedule is not None else None,
        parameters={"cfg": cfg.model_dump(mode="json")},
        description=f"meta-train {cfg.artifacts.name} from {args.config}",
        limit=args.limit,
        entrypoint_type=EntrypointType.MODULE_PATH,
    )


def _command(args: argparse.Namespace) -> list[str]:
    """The ``offmeta run`` command line of ``args``, without ``--resume``."""
    sets = [part for override in args.overrides for part in ("--set", override)]
    return ["offmeta", "run", "--config", args.config, *sets]


def _load(args: argparse.Namespace, command: str) -> MetaTrainConfig | None:
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as error:
        print(f"offmeta {command}: {error}", file=sys.stderr)
        return None


def _resume_dir(resume: str | None, cfg: MetaTrainConfig) -> str | None:
    """The run directory ``--resume`` names or finds (None without ``--resume``)."""
    if resume is None:
        return None
    if resume == _NEWEST:
        return str(find_resumable(cfg))
    check_resumable(read_run(resume), cfg)
    return resume


def _data_fits(cfg: MetaTrainConfig) -> bool:
    """Check the data before Ray and Prefect start (they take half a minute to start and bury
    the cause under their tracebacks); False after saying why in one line."""
    from flows.stages.datasets import inspect_datasets, value_warnings
    from pipeline.contract.schema import DatasetError

    try:
        datasets = inspect_datasets(cfg)
    except DatasetError as error:
        print(f"offmeta run: {error}", file=sys.stderr)
        return False
    for warning in value_warnings(*datasets):
        print(f"offmeta run: warning: {warning}", file=sys.stderr)
    return True


def _networks_build(cfg: MetaTrainConfig) -> bool:
    """Build the networks of factories and conv encoders once before Ray starts and the flow
    runs (user code, a factory's output that does not fit its head, a layer whose vmap
    batching rule is wrong, or images too small for the encoder, fail here in one line);
    False after saying why. The built-in MLP is checked by the config alone."""
    meta = cfg.learners.meta_config()
    modules = meta.modules
    if all(
        spec.model.factory is None and spec.model.encoder == "flat" for spec in modules.values()
    ):
        return True
    from learners.meta.vectorized_check import refuse_wrong_batching
    from learners.models.factory import build_models

    try:
        refuse_wrong_batching(meta, build_models(modules, meta.seed))
    except ValueError as error:
        print(f"offmeta run: {error}", file=sys.stderr)
        return False
    return True


def _schedule(cron: str | None, timezone: str) -> CronSchedule | None:
    """The cron schedule (None without --cron); ValueError saying why an invalid one is."""
    if cron is None:
        return None
    from prefect.client.schemas.schedules import CronSchedule
    from pydantic import ValidationError

    try:
        return CronSchedule(cron=cron, timezone=timezone)
    except ValidationError as error:
        reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
        raise ValueError(f"--cron {cron!r} --timezone {timezone!r}: {reasons}") from None


def _api_answers(command: str, url: str | None) -> bool:
    """Whether the Prefect server at ``url`` answers (True without one: Prefect starts a
    temporary server); False after saying so in one line."""
    if url is None:
        return True
    try:
        check_api_answers(url)
    except PrefectApiError as error:
        print(f"offmeta {command}: {error}", file=sys.stderr)
        return False
    return True
