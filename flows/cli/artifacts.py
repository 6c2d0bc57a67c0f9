"""``offmeta artifacts``: list, show, verify, alias, export, gc and mirror published artifacts.

Every subcommand takes ``--root`` (a directory, a ``file://`` URI or ``s3://bucket/prefix``;
default ``$OFFMETA_ARTIFACTS``, else ``./artifacts``) and ``--json``. Errors print one line
to stderr and exit with status 1. The store is imported when a command runs (``offmeta
--help`` does not pay for pydantic), and it imports neither torch, Ray nor Prefect, so these
commands start fast and work in a light install.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from flows.cli.mirroring import add_target_arguments, mirror_alias, register_mirror, run_mirror

if TYPE_CHECKING:
    from pipeline.artifacts import ArtifactStore, Manifest

_ROOT_ENV = "OFFMETA_ARTIFACTS"


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "artifacts",
        help="inspect, verify, alias and export published artifacts",
        description="Inspect the versioned artifact store that training runs publish to.",
    )
    commands = group.add_subparsers(dest="artifacts_command", required=True, metavar="COMMAND")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--root",
        default=None,
        help=f"store directory, file:// URI or s3://bucket/prefix (default: ${_ROOT_ENV}, "
        "else ./artifacts); S3 endpoint and credentials come from the AWS_* variables",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of tables")

    listing = commands.add_parser(
        "list", parents=[common], help="artifact names, or the versions of one artifact"
    )
    listing.add_argument("name", nargs="?", help="list this artifact's versions")
    listing.set_defaults(handler=_handler(_list))

    show = commands.add_parser("show", parents=[common], help="one version's manifest")
    show.add_argument("spec", help="NAME, NAME:VERSION or NAME@ALIAS")
    show.set_defaults(handler=_handler(_show))

    verify = commands.add_parser(
        "verify", parents=[common], help="re-hash every file of the given versions"
    )
    verify.add_argument("specs", nargs="+", metavar="spec", help="NAME, NAME:VERSION or NAME@ALIAS")
    verify.set_defaults(handler=_handler(_verify))

    alias = commands.add_parser(
        "alias",
        parents=[common],
        help="point NAME@ALIAS at VERSION (compare-and-swap)",
        description="Point NAME@ALIAS at VERSION. With --expected the move happens only if "
        "the alias still points at that version ('none': does not exist yet); without it, "
        "the alias's current target is read and used as the expectation. 'latest' never "
        "moves backwards.",
    )
    alias.add_argument("name")
    alias.add_argument("alias")
    alias.add_argument("version", type=int)
    alias.add_argument("--expected", help="version the alias must point at now, or 'none'")
    add_target_arguments(alias, required=False)
    alias.set_defaults(handler=_handler(_alias))

    register_mirror(commands, common)
    commands.choices["mirror"].set_defaults(handler=_handler(run_mirror))

    export = commands.add_parser(
        "export",
        parents=[common],
        help="write params.safetensors, manifest.json and the other files to DIR",
    )
    export.add_argument("spec", help="NAME, NAME:VERSION or NAME@ALIAS")
    export.add_argument("directory", help="target directory (files in it are never overwritten)")
    export.set_defaults(handler=_handler(_export))

    gc = commands.add_parser(
        "gc", parents=[common], help="remove leftovers of interrupted publishes"
    )
    gc.add_argument(
        "--older-than",
        type=float,
        metavar="SECONDS",
        help="only remove leftovers older than this (default: 0 for a directory, where gc "
        "waits for running publishes; 3600 on S3, where it cannot)",
    )
    gc.set_defaults(handler=_handler(_gc))


def _handler(command: Callable[[ArtifactStore, argparse.Namespace], int]) -> Callable[..., int]:
    def handler(args: argparse.Namespace) -> int:
        from pipeline.artifacts import ArtifactError, ArtifactStore

        root = args.root or os.environ.get(_ROOT_ENV) or "artifacts"
        try:
            return command(ArtifactStore(root), args)
        except (ArtifactError, OSError) as exc:
            print(f"offmeta artifacts {args.artifacts_command}: error: {exc}", file=sys.stderr)
            return 1

    return handler


def _list(store: ArtifactStore, args: argparse.Namespace) -> int:
    if args.name is None:
        rows = []
        for name in store.list_names():
            versions = store.list_versions(name)
            aliases = store.aliases(name)
            latest = store.get(name, version=aliases.get("latest", versions[-1]))
            rows.append(
                {
                    "name": name,
                    "versions": len(versions),
                    "latest": latest.version,
                    "created_at": latest.created_at.isoformat(timespec="seconds"),
                    "aliases": aliases,
                }
            )
        if args.json:
            return _print_json(rows)
        if not rows:
            print(f"no artifacts in {store.root}")
            return 0
        table = [
            [r["name"], r["versions"], r["latest"], r["created_at"], _aliases_text(r["aliases"])]
            for r in rows
        ]
        _print_table(["NAME", "VERSIONS", "LATEST", "CREATED", "ALIASES"], table)
        return 0
    versions = store.list_versions(args.name)
    if not versions:
        store.get(args.name)  # raises the not-found error that lists known names
    by_version: dict[int, list[str]] = {}
    for alias, version in store.aliases(args.name).items():
        by_version.setdefault(version, []).append(alias)
    manifests = [store.get(args.name, version=v) for v in versions]
    if args.json:
        return _print_json(
            [_summary(m) | {"aliases": by_version.get(m.version, [])} for m in manifests]
        )
    table = [
        [
            m.version,
            m.created_at.isoformat(timespec="seconds"),
            _size(m.files["params.safetensors"].size),
            _short(m.params_digest),
            ",".join(by_version.get(m.version, [])),
            _metrics_text(m.metrics),
        ]
        for m in manifests
    ]
    _print_table(["VERSION", "CREATED", "PARAMS", "DIGEST", "ALIASES", "METRICS"], table)
    return 0


def _show(store: ArtifactStore, args: argparse.Namespace) -> int:
    manifest = store.get(args.spec)
    ref = store.resolve(manifest.spec)
    aliases = sorted(a for a, v in store.aliases(manifest.name).items() if v == manifest.version)
    if args.json:
        document = manifest.model_dump(mode="json")
        return _print_json({"ref": str(ref), "uri": ref.uri, "aliases": aliases, **document})
    lineage = manifest.lineage.model_dump(mode="json", exclude_none=True)
    extras = lineage.pop("extras", {})
    print(f"{manifest.spec}  ({', '.join(aliases) or 'no aliases'})")
    print(f"  digest:      {manifest.params_digest}")
    print(f"  created:     {manifest.created_at.isoformat(timespec='seconds')}")
    print(f"  manifest:    {ref.uri}")
    if manifest.idempotency_key is not None:
        print(f"  key:         {manifest.idempotency_key}")
    print("lineage:" + ("" if lineage or extras else " (none recorded)"))
    for key, value in {**lineage, **extras}.items():
        print(f"  {key}: {json.dumps(value)}")
    print("metrics:" + ("" if manifest.metrics else " (none)"))
    for key, value in manifest.metrics.items():
        print(f"  {key}: {json.dumps(value)}")
    print(f"config: {json.dumps(manifest.config, sort_keys=True)}")
    print("modules:")
    module_rows = []
    for module in manifest.modules:
        entries = [t for key, t in manifest.tensors.items() if key.split("/", 1)[0] == module]
        elements = sum(_numel(t.shape) for t in entries)
        dtypes = ",".join(sorted({t.dtype for t in entries})) or "-"
        module_rows.append([module, len(entries), f"{elements:,}", dtypes])
    _print_table(["MODULE", "TENSORS", "ELEMENTS", "DTYPES"], module_rows, indent="  ")
    print("files:")
    file_rows = [
        [name, _size(entry.size), entry.media_type, _short(entry.digest)]
        for name, entry in sorted(manifest.files.items())
    ]
    _print_table(["FILE", "SIZE", "TYPE", "DIGEST"], file_rows, indent="  ")
    pictures = [
        name for name, entry in sorted(manifest.files.items()) if entry.media_type == "image/png"
    ]
    if pictures:
        print(
            f"pictures: {', '.join(pictures)} (write them out: offmeta artifacts export "
            f"{manifest.spec} DIR)"
        )
    return 0


def _verify(store: ArtifactStore, args: argparse.Namespace) -> int:
    from pipeline.artifacts import ArtifactError

    results = []
    for spec in args.specs:
        try:
            manifest = store.verify(spec)
        except ArtifactError as exc:
            results.append({"spec": spec, "ok": False, "error": str(exc)})
        else:
            results.append({"spec": manifest.spec, "ok": True, "files": sorted(manifest.files)})
    if args.json:
        _print_json(results)
    else:
        for result in results:
            if result["ok"]:
                print(f"OK      {result['spec']}  ({len(result['files'])} files verified)")
            else:
                print(f"FAILED  {result['spec']}: {result['error']}", file=sys.stderr)
    return 0 if all(r["ok"] for r in results) else 1


def _alias(store: ArtifactStore, args: argparse.Namespace) -> int:
    from pipeline.artifacts import ArtifactError

    if args.expected is None:
        expected = store.aliases(args.name).get(args.alias)
    elif args.expected.lower() == "none":
        expected = None
    else:
        try:
            expected = int(args.expected)
        except ValueError:
            raise ArtifactError(
                f"--expected must be a version number or 'none', got {args.expected!r}"
            ) from None
    store.set_alias(args.name, args.alias, args.version, expected=expected)
    if args.json:
        _print_json(
            {"name": args.name, "alias": args.alias, "version": args.version, "previous": expected}
        )
        return mirror_alias(store, args) if args.to == "mlflow" else 0
    before = "(new)" if expected is None else str(expected)
    print(f"{args.name}@{args.alias}: {before} -> {args.version}")
    return mirror_alias(store, args) if args.to == "mlflow" else 0


def _export(store: ArtifactStore, args: argparse.Namespace) -> int:
    manifest = store.get(args.spec)
    written = store.export(manifest, args.directory)
    if args.json:
        return _print_json({"spec": manifest.spec, "files": [str(path) for path in written]})
    print(f"exported {manifest.spec} to {args.directory}:")
    for path in written:
        print(f"  {path.name}")
    return 0


def _gc(store: ArtifactStore, args: argparse.Namespace) -> int:
    report = store.gc(older_than=args.older_than)
    if args.json:
        return _print_json(vars(report))
    print(
        f"removed {report.temp_files} staged files, {report.blobs} unreferenced blobs "
        f"({_size(report.freed_bytes)}) and {report.key_records} stale idempotency records"
    )
    return 0


def _summary(manifest: Manifest) -> dict[str, Any]:
    return {
        "spec": manifest.spec,
        "version": manifest.version,
        "created_at": manifest.created_at.isoformat(),
        "digest": manifest.params_digest,
        "params_bytes": manifest.files["params.safetensors"].size,
        "metrics": manifest.metrics,
    }


def _print_json(value: object) -> int:
    print(json.dumps(value, indent=2, sort_keys=True))
    return 0


def _print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], indent: str = ""
) -> None:
    cells = [[str(cell) for cell in row] for row in [headers, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print(indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def _aliases_text(aliases: dict[str, int]) -> str:
    return ", ".join(f"{alias}={version}" for alias, version in sorted(aliases.items()))


def _metrics_text(metrics: dict[str, Any], limit: int = 60) -> str:
    text = " ".join(f"{k}={_number(v)}" for k, v in metrics.items())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _number(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)


def _short(digest: str) -> str:
    return digest[: len("sha256:") + 12]


def _size(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    units = ("KB", "MB", "GB")
    value, index = size / 1024, 0
    while value >= 1024 and index < len(units) - 1:
        value, index = value / 1024, index + 1
    return f"{value:.1f} {units[index]}"


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count
