"""Generate the README's Performance table from the records in ``bench/results/``.

One row per figure, shape and machine (runs of other sizes or on other machines are never
mixed into one range): the latest run's figure (the ratio to its baseline, or the value when
there is none), the range over every recorded run (ranges as measured, never the best
round), the target, and whether the latest run met it and how many runs did.

    .venv/bin/python bench/readme_table.py           # rewrite the table in README.md
    .venv/bin/python bench/readme_table.py --check   # exit 1 when README.md is out of date

The table sits between the lines ``<!-- bench:begin -->`` and ``<!-- bench:end -->``.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import RESULTS, ROOT, read_records

README = ROOT / "README.md"
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"


class FigureRow(NamedTuple):
    """One figure measured at one shape on one machine, over all its recorded runs."""

    latest: dict[str, Any]
    low: float
    high: float
    runs: int
    met_runs: int
    software: tuple[str, ...]
    """The distinct software versions of the runs."""


def headline(record: dict[str, Any]) -> float:
    """The number a record's target applies to: its ratio, or its value without a baseline."""
    return record["ratio"] if record["ratio"] is not None else record["value"]


def figure_rows(records: list[dict[str, Any]]) -> list[FigureRow]:
    """Group ``records`` by bench, figure, shape and machine; order by bench, then figure."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(_row_key(record), []).append(record)
    rows = []
    for key in sorted(groups):
        group = groups[key]
        numbers = [headline(record) for record in group]
        rows.append(
            FigureRow(
                latest=max(group, key=lambda record: datetime.fromisoformat(record["date"])),
                low=min(numbers),
                high=max(numbers),
                runs=len(group),
                met_runs=sum(record["met"] is True for record in group),
                software=tuple(sorted({_software_text(record) for record in group})),
            )
        )
    return rows


def render_table(rows: list[FigureRow]) -> str:
    """The Markdown table and, below it, what each machine label stands for."""
    if not rows:
        return "No records yet: run the bench scripts (see Development)."
    machines: dict[str, str] = {}
    software: dict[str, set[str]] = {}
    lines = [
        "| bench | figure | baseline (same run) | shape | latest (date, revision, load) "
        "| range (runs) | target | met (runs met) | machine |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        record = row.latest
        machine = machines.setdefault(_machine_text(record), f"M{len(machines) + 1}")
        software.setdefault(machine, set()).update(row.software)
        baseline = record["baseline"]
        git = record["git"]
        revision = (git["revision"] or "no git")[:10] + ("+dirty" if git["dirty"] else "")
        if record["target"] is None:
            met = "report only"
        else:
            met = "yes" if record["met"] else "**no**"
            met += f" ({row.met_runs}/{row.runs})"
        cells = [
            f"`{record['bench']}`",
            f"{record['figure']}: {record['description']}",
            "none" if baseline is None else baseline["description"],
            _shape_text(record["shape"]),
            f"{_number_text(record)} ({record['date'][:10]}, {revision}, load "
            f"{record['machine']['load_average_1m']:.1f})",
            f"{_format(row.low)}–{_format(row.high)} ({row.runs})",
            record["target"] or "none",
            met,
            machine,
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    lines.append("")
    lines.extend(
        f"{label}: {text}; {' or '.join(sorted(software[label]))}"
        for text, label in machines.items()
    )
    lines.append(
        "load: the machine's 1-minute load average when the latest run wrote its record "
        "(against its cores: how busy it was)."
    )
    return "\n".join(lines)


def render_readme(readme: str, table: str) -> str:
    """``readme`` with the text between the markers replaced by ``table``."""
    counts = readme.count(BEGIN), readme.count(END)
    if counts != (1, 1):
        found = f"found {counts[0]} of the first and {counts[1]} of the second"
    elif readme.index(BEGIN) > readme.index(END):
        found = "found the second before the first"
    else:
        found = ""
    if found:
        raise ValueError(
            f"README.md needs one line {BEGIN} and, after it, one line {END} around the "
            f"Performance table; {found}"
        )
    before, rest = readme.split(BEGIN)
    after = rest.split(END)[1]
    return f"{before}{BEGIN}\n{table}\n{END}{after}"


def check_readme(readme: Path = README, results: Path = RESULTS) -> str | None:
    """None when ``readme``'s table is what the records give, else the difference."""
    current = readme.read_text()
    wanted = render_readme(current, render_table(figure_rows(read_records(results))))
    if current == wanted:
        return None
    diff = difflib.unified_diff(
        current.splitlines(), wanted.splitlines(), "README.md", "from the records", lineterm=""
    )
    return (
        f"{readme}'s Performance table differs from the records in {results}; regenerate it "
        "with `.venv/bin/python bench/readme_table.py`:\n" + "\n".join(diff)
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README.md is stale")
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.check:
        difference = check_readme(args.readme, args.results)
        if difference is not None:
            print(difference, file=sys.stderr)
            return 1
        print(f"{args.readme} matches the records in {args.results}")
        return 0
    rows = figure_rows(read_records(args.results))
    args.readme.write_text(render_readme(args.readme.read_text(), render_table(rows)))
    print(f"wrote {len(rows)} figures from {args.results} into {args.readme}")
    return 0


def _row_key(record: dict[str, Any]) -> tuple[str, ...]:
    return (
        record["bench"],
        record["figure"],
        json.dumps(record["shape"], sort_keys=True),
        _machine_text(record),
    )


def _machine_text(record: dict[str, Any]) -> str:
    machine = record["machine"]
    return (
        f"{machine['cores']} cores, {machine['cpu']}, {machine['ram_bytes'] / 2**30:.1f} GiB "
        f"RAM, device {machine['device']}"
    )


def _software_text(record: dict[str, Any]) -> str:
    return ", ".join(f"{name} {version}" for name, version in sorted(record["software"].items()))


def _shape_text(shape: dict[str, Any]) -> str:
    return ", ".join(
        f"{name} {value:,}" if type(value) is int else f"{name} {value}"
        for name, value in shape.items()
    )


def _number_text(record: dict[str, Any]) -> str:
    if record["ratio"] is not None:
        return _format(record["ratio"])
    return f"{_format(record['value'])} {record['unit']}"


def _format(number: float) -> str:
    if abs(number) >= 1000:
        return f"{number:,.0f}"
    return f"{number:.3g}"


if __name__ == "__main__":
    raise SystemExit(main())
