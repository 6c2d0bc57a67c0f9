"""The ``offmeta`` command line.

Each command group lives in its own module of this package and exposes
``register(subparsers)``; heavy imports (Ray, torch, Prefect) happen inside the
handlers so that ``offmeta --help`` and the artifact commands start quickly. A command
line that names its command imports only that command's module: ``offmeta artifacts``
never imports the training side (``flows.config``, ``learners``), so it runs in a light
install without Ray or Prefect.
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import sys
from collections.abc import Sequence

from flows.process.signals import leave_without_teardown

_GROUPS = ("data", "artifacts", "run")
"""Modules of this package; each registers its commands."""
_MODULE_OF = {"serve": "run"}
"""Commands registered by a module of another name."""
# What `pip install offmeta` leaves out and `offmeta[train]` brings.
_TRAINING_PACKAGES = frozenset({"ray", "prefect", "pyarrow"})


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser for every command, or only for ``command`` when it is a known one."""
    parser = argparse.ArgumentParser(
        prog="offmeta",
        description="Offline meta-training: datasets, training runs and versioned artifacts.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    module = _MODULE_OF.get(command or "", command)
    for name in [module] if module in _GROUPS else _GROUPS:
        importlib.import_module(f"flows.cli.{name}").register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(argv[0] if argv else None).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except ModuleNotFoundError as error:
        package = (error.name or "").split(".")[0]
        if package not in _TRAINING_PACKAGES:
            raise
        print(
            f"offmeta {args.command}: error: this command needs the training extra, and "
            f"{package!r} is not installed; install it with: pip install 'offmeta[train]'",
            file=sys.stderr,
        )
        return 1


def run() -> None:
    """Console-script entry point: the process ends as soon as what it did is written.

    After a command returns, the exit handlers run as usual (Prefect's log and event workers
    send what they hold, the temporary Prefect server stops, logging flushes), and then the
    process leaves without tearing the interpreter down: with Ray, torch, pyarrow and Prefect
    loaded that teardown (module and C++ static destructors) took 6-16 s after the last line
    of ``offmeta run``, with nothing left to write. A command that raises ends as Python
    ends it, after printing the traceback.
    """
    status: list[int] = []
    # Registered first, so it runs after every exit handler registered later.
    atexit.register(_leave, status)
    status.append(main())
    sys.exit(status[0])


def _leave(status: list[int]) -> None:
    if status:
        leave_without_teardown(status[0])


if __name__ == "__main__":
    run()
