"""``offmeta artifacts mirror SPEC --to mlflow`` and the ``--to mlflow`` of ``artifacts alias``.

``mirror`` backfills: ``NAME`` mirrors every version, ``NAME:V`` / ``NAME@ALIAS`` one version
and the unmirrored ones before it (MLflow's ``@latest`` is its highest number, so versions are
registered oldest first), then every alias; a version already in MLflow is found by its tags
and left alone, so a re-run creates nothing. ``alias --to mlflow`` moves the MLflow alias
after the offmeta one. The tracking URI comes from ``--tracking-uri`` or
``$MLFLOW_TRACKING_URI``; mlflow itself is imported only when a command mirrors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipeline.artifacts import ArtifactStore
    from pipeline.mlflow.mirror import MirrorResult, MlflowTarget

DEFAULT_EXPERIMENT = "offmeta"


def add_target_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """``--to mlflow`` and where the MLflow registry is."""
    parser.add_argument(
        "--to",
        choices=["mlflow"],
        required=required,
        help="mirror to this registry (MLflow, the offmeta[mlflow] extra)",
    )
    parser.add_argument(
        "--tracking-uri", help="MLflow tracking server (default: $MLFLOW_TRACKING_URI)"
    )
    parser.add_argument(
        "--experiment",
        default=DEFAULT_EXPERIMENT,
        help=f"MLflow experiment of the mirrored runs (default: {DEFAULT_EXPERIMENT})",
    )
    parser.add_argument(
        "--registered-model", help="MLflow registered model (default: the artifact's name)"
    )


def register_mirror(commands: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The ``mirror`` subcommand; its handler is set by the caller (``flows.cli.artifacts``)."""
    mirror = commands.add_parser(
        "mirror",
        parents=[common],
        help="backfill versions into an MLflow model registry (idempotent)",
        description="Mirror versions into an MLflow model registry: NAME mirrors every "
        "version, NAME:VERSION or NAME@ALIAS that version and the unmirrored ones before it; "
        "then the aliases. Versions already mirrored (found by their offmeta.* tags) are "
        "left as they are.",
    )
    mirror.add_argument("spec", help="NAME, NAME:VERSION or NAME@ALIAS")
    add_target_arguments(mirror, required=True)


def target(args: argparse.Namespace, name: str) -> MlflowTarget:
    from pipeline.mlflow.mirror import MlflowTarget

    return MlflowTarget.resolve(args.tracking_uri, args.experiment, args.registered_model or name)


def run_mirror(store: ArtifactStore, args: argparse.Namespace) -> int:
    """``offmeta artifacts mirror``: prints what MLflow holds for each version."""
    from pipeline.artifacts.records.names import parse_spec

    try:
        from pipeline.mlflow.mirror import mirror

        result = mirror(store, args.spec, target(args, parse_spec(args.spec).name))
    except Exception as error:  # MLflow's and its HTTP client's errors as one line
        print(f"offmeta artifacts mirror: error: {_describe(error)}", file=sys.stderr)
        return 1
    return _report(result, args)


def mirror_alias(store: ArtifactStore, args: argparse.Namespace) -> int:
    """After ``offmeta artifacts alias``: mirror the alias's version (if needed) and the alias."""
    try:
        from pipeline.mlflow.mirror import mirror

        result = mirror(store, f"{args.name}:{args.version}", target(args, args.name))
    except Exception as error:  # the offmeta alias has moved; say so, whatever MLflow did
        print(
            f"offmeta artifacts alias: error: {args.name}@{args.alias} moved in offmeta, but "
            f"not in MLflow: {_describe(error)}; retry with: offmeta artifacts mirror "
            f"{args.name}@{args.alias} --to mlflow",
            file=sys.stderr,
        )
        return 1
    if not args.json:
        print(f"mlflow: {result.summary()}")
    return 0


def _report(result: MirrorResult, args: argparse.Namespace) -> int:
    if args.json:
        document = {
            "versions": [vars(version) for version in result.versions],
            "aliases": result.aliases,
            "skipped_aliases": result.skipped_aliases,
        }
        print(json.dumps(document, indent=2, sort_keys=True))
        return 0
    for version in result.versions:
        state = "created" if version.created else "already mirrored"
        print(
            f"{version.spec} -> {version.registered_model} version {version.mlflow_version} "
            f"(run {version.run_id}, {state})"
        )
    for alias, mlflow_version in result.aliases.items():
        print(f"@{alias} -> {mlflow_version}")
    for alias, reason in result.skipped_aliases.items():
        print(f"@{alias} not mirrored: {reason}")
    return 0


def _describe(error: Exception) -> str:
    if isinstance(error, ModuleNotFoundError) and (error.name or "").startswith("mlflow"):
        return "mlflow is not installed; install it with: pip install 'offmeta[mlflow]'"
    from pipeline.artifacts import ArtifactError

    if isinstance(error, ArtifactError):
        return str(error)
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else '(no message)'}"
