"""``offmeta data``: generate synthetic datasets, import other tools' recordings, validate
and compact datasets on disk.

``validate`` runs every check ``read_episodes`` runs, without starting Ray: it reads
footers, ``dataset.json``, the id and flag columns, the value columns (``--check-values``)
and the file bytes (for the fingerprint).
``compact`` rewrites a dataset into well-sized files sorted by (task_id, eps_id, t).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, get_args

from pipeline.contract.id_findings import VALIDATION_MEMORY_MB
from pipeline.contract.schema import CheckValues


def _yes_no(text: str) -> bool:
    if text not in ("yes", "no"):
        raise argparse.ArgumentTypeError(f"expected yes or no, got {text!r}")
    return text == "yes"


_GENERATOR_OPTIONS: dict[str, list[tuple[str, type, str]]] = {
    "sinusoid": [("--points", int, "points (rows) per task (default 20)")],
    "point_robot": [
        ("--episodes-per-task", int, "expert episodes per goal (default 5)"),
        ("--noise-std", float, "Gaussian noise on each expert action component (default 0.03)"),
        ("--random-fraction", float, "fraction of random actions (default 0.1)"),
        (
            "--behavior",
            str,
            "expert (noise-free), noisy (default: the noisy expert) or mixed (random-policy "
            "and noisy-expert episodes)",
        ),
        ("--random-share", float, "mixed: share of random-policy episodes per task (default 0.4)"),
    ],
    "point_robot_pixels": [
        ("--episodes-per-task", int, "expert episodes per goal (default 4)"),
        ("--noise-std", float, "Gaussian noise on each expert action component (default 0.03)"),
        ("--random-fraction", float, "fraction of random actions (default 0.1)"),
        ("--image-size", int, "image height and width in pixels (default 32)"),
        ("--blob-sigma", float, "standard deviation of the robot's blob in pixels (default 1)"),
        ("--layout", str, "axis order of the stored images: CHW (default) or HWC"),
        ("--new-obs", _yes_no, "record new_obs: yes (default) or no (half the image bytes)"),
    ],
}


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser(
        "data", help="generate, import, validate and compact episode datasets"
    )
    commands = data.add_subparsers(dest="data_command", required=True, metavar="COMMAND")

    generate = commands.add_parser(
        "generate",
        help="write a synthetic dataset as OUT/train and OUT/heldout",
        description="Write a synthetic dataset's train and held-out splits, deterministic "
        "from --seed.",
    )
    generators = generate.add_subparsers(dest="generator", required=True, metavar="NAME")
    for name, options in _GENERATOR_OPTIONS.items():
        parser = generators.add_parser(name, help=f"the {name} task family")
        parser.add_argument("--tasks", type=int, help="train tasks (default: the family's)")
        parser.add_argument(
            "--heldout-tasks", type=int, help="held-out tasks (default: the family's)"
        )
        parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
        parser.add_argument(
            "--rows-per-file", type=int, help="rows per Parquet file (default 1048576)"
        )
        for flag, kind, text in options:
            parser.add_argument(flag, type=kind, help=text)
        parser.add_argument("--out", required=True, help="output directory")
        parser.set_defaults(handler=_generate, family_options=[o[0] for o in options])

    validate = commands.add_parser(
        "validate",
        help="check a dataset and print its summary",
        description="Check a dataset against the episode contract (exit 0 and print its "
        "summary, or print the problem and exit 1). Several paths are checked one by one.",
    )
    validate.add_argument("paths", nargs="+", metavar="PATH", help="file, directory, glob or URI")
    validate.add_argument(
        "--column-map",
        action="append",
        default=[],
        metavar="CANONICAL=DISK",
        help="read canonical column CANONICAL from column DISK (repeatable)",
    )
    validate.add_argument(
        "--allow-partial-episodes",
        action="store_true",
        help="accept episodes that do not start at t 0, miss steps or end early (a knowingly "
        "partial dataset)",
    )
    validate.add_argument(
        "--check-values",
        choices=get_args(CheckValues),
        default="full",
        help="scan obs, new_obs, actions and rewards for NaN, inf and actions outside "
        "dataset.json's action space in every row group (full, the default), in one row group "
        "in 16 (sample: for datasets whose full scan takes too long), or not at all (off)",
    )
    validate.add_argument(
        "--validation-memory-mb",
        type=_megabytes,
        default=VALIDATION_MEMORY_MB,
        metavar="MB",
        help="memory the id checks may use (default %(default)g); larger datasets are sorted "
        "on disk in a temporary directory (docs/data-contract.md#memory)",
    )
    validate.add_argument("--json", action="store_true", help="print summaries as JSON lines")
    validate.set_defaults(handler=_validate)
    _register_import(commands)


def _register_import(commands: argparse._SubParsersAction) -> None:
    importer = commands.add_parser(
        "import",
        help="convert an RLlib or Minari recording into a canonical dataset",
        description="Convert another tool's recording into the canonical layout once: sorted "
        "by (task, episode, t), ~128 MiB files, dataset.json naming the source's fingerprint. "
        "Nothing is written when the recording is refused.",
    )
    tools = importer.add_subparsers(dest="tool", required=True, metavar="TOOL")
    for tool, text in (
        ("rllib", "RLlib's offline recorder output (config.offline_data(output=...))"),
        ("minari", "a Minari dataset directory (arrow or parquet storage)"),
    ):
        parser = tools.add_parser(tool, help=text)
        parser.add_argument("src", metavar="SRC", help=text)
        parser.add_argument("--out", required=True, help="new or empty output directory")
        parser.add_argument(
            "--task-id",
            help="task id of every row (default: the environment directory for rllib, the "
            "dataset id for minari)",
        )
        parser.set_defaults(handler=_import)

    compact = commands.add_parser(
        "compact",
        help="rewrite a dataset into ~128 MiB files sorted by task, episode and step",
        description="Rewrite a dataset (validated first) into part-NNNNN.parquet files of "
        "about --file-mib MiB, sorted by (task_id, eps_id, t), with canonical column names "
        "and types; dataset.json is carried over with the source's fingerprint under "
        "'compacted_from'. OUT must not exist; nothing is left there when the source is "
        "refused or the run fails.",
    )
    compact.add_argument("source", metavar="SRC", help="file, directory, glob or URI")
    compact.add_argument("--out", required=True, help="new output directory")
    compact.add_argument(
        "--column-map",
        action="append",
        default=[],
        metavar="CANONICAL=DISK",
        help="read canonical column CANONICAL from column DISK (repeatable)",
    )
    compact.add_argument("--file-mib", type=int, default=128, help="file size (default 128)")
    compact.add_argument(
        "--row-group-rows", type=int, default=65536, help="rows per row group (default 65536)"
    )
    compact.add_argument(
        "--memory-mib", type=int, default=512, help="rows held in memory to sort (default 512)"
    )
    compact.set_defaults(handler=_compact)


def _generate(args: argparse.Namespace) -> int:
    from pipeline.reads.episodes import inspect_episodes
    from pipeline.synthetic import GENERATORS, ROWS_PER_FILE, generate

    options = {
        flag.lstrip("-").replace("-", "_"): getattr(args, flag.lstrip("-").replace("-", "_"))
        for flag in args.family_options
    }
    try:
        family = GENERATORS[args.generator](**{k: v for k, v in options.items() if v is not None})
        written = generate(
            family,
            args.out,
            tasks=args.tasks,
            heldout_tasks=args.heldout_tasks,
            seed=args.seed,
            rows_per_file=args.rows_per_file or ROWS_PER_FILE,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ValueError as exc:
        print(f"offmeta data generate: {exc}", file=sys.stderr)
        return 1
    for split, directory in written.items():
        _print_summary(inspect_episodes(directory).summary(), as_json=False, title=split)
    return 0


def _validate(args: argparse.Namespace) -> int:
    from pipeline.contract.schema import DatasetError
    from pipeline.reads.episodes import inspect_episodes
    from pipeline.writes.compact import small_files_warning

    try:
        column_map = _parse_column_map(args.column_map)
    except ValueError as exc:
        print(f"offmeta data validate: {exc}", file=sys.stderr)
        return 1
    status = 0
    for path in args.paths:
        try:
            info = inspect_episodes(
                path,
                column_map=column_map,
                allow_partial_episodes=args.allow_partial_episodes,
                check_values=args.check_values,
                validation_memory_mb=args.validation_memory_mb,
            )
        except DatasetError as exc:
            print(f"offmeta data validate: {exc}", file=sys.stderr)
            status = 1
            continue
        _print_summary(info.summary(), as_json=args.json, title=path)
        if info.values.warning is not None:
            print(f"offmeta data validate: warning: {info.values.warning}", file=sys.stderr)
        warning = small_files_warning(info)
        if warning is not None:
            print(f"offmeta data validate: warning: {warning}", file=sys.stderr)
    return status


def _import(args: argparse.Namespace) -> int:
    from pipeline.contract.schema import DatasetError
    from pipeline.importers import import_minari, import_rllib

    run = {"rllib": import_rllib, "minari": import_minari}[args.tool]
    try:
        summary = run(
            args.src,
            args.out,
            task_id=args.task_id,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except (DatasetError, ValueError) as exc:
        print(f"offmeta data import {args.tool}: {exc}", file=sys.stderr)
        return 1
    print(summary.line())
    return 0


def _compact(args: argparse.Namespace) -> int:
    from pipeline.contract.schema import DatasetError
    from pipeline.writes.compact import compact

    try:
        info = compact(
            args.source,
            args.out,
            column_map=_parse_column_map(args.column_map),
            file_bytes=args.file_mib << 20,
            row_group_rows=args.row_group_rows,
            memory_bytes=args.memory_mib << 20,
        )
    except (DatasetError, ValueError, FileExistsError, FileNotFoundError) as exc:
        print(f"offmeta data compact: {exc}", file=sys.stderr)
        return 1
    _print_summary(info.summary(), as_json=False, title=args.out)
    return 0


def _megabytes(text: str) -> float:
    try:
        megabytes = float(text)
    except ValueError:
        megabytes = 0.0
    if not megabytes > 0:
        raise argparse.ArgumentTypeError(f"expected a number of MB above 0, got {text!r}")
    return megabytes


def _parse_column_map(pairs: list[str]) -> dict[str, str]:
    mapping = {}
    for pair in pairs:
        canonical, sep, on_disk = pair.partition("=")
        if not sep or not canonical or not on_disk:
            raise ValueError(
                f"--column-map {pair!r}: expected CANONICAL=DISK, e.g. --column-map obs=observation"
            )
        mapping[canonical] = on_disk
    return mapping


def _print_summary(summary: dict[str, Any], *, as_json: bool, title: str) -> None:
    if as_json:
        print(json.dumps(summary, sort_keys=True))
        return
    print(f"{title}: OK")
    width = max(len(key) for key in summary)
    for key, value in summary.items():
        shown = json.dumps(value) if isinstance(value, list | bool) or value is None else value
        print(f"  {key:<{width}}  {shown}")
