"""The ``offmeta`` command line.

Each command group lives in its own module of this package and exposes
``register(subparsers)``; heavy imports (Ray, torch, Prefect) happen inside the
handlers so that ``offmeta --help`` and the artifact commands start quickly.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

_GROUPS = ("data", "artifacts", "run")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="offmeta",
        description="Offline meta-training: datasets, training runs and versioned artifacts.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in _GROUPS:
        module = importlib.import_module(f"flows.cli.{group}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.handler(args) or 0)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    run()
