"""Generate the Performance table (docs/performance.md) and the README's headline figures
from the records in ``bench/results/``.

One table row per figure, shape and machine (runs of other sizes or on other machines are
never mixed into one range): the latest run's figure (the ratio to its baseline, or the value
when there is none), the range over every recorded run (ranges as measured, never the best
round), the target, and whether the latest run met it and how many runs did. The README shows
the rows of the ``HEADLINES`` figures that have records, each the row of its figure whose latest
run is the newest.

    .venv/bin/python bench/readme_table.py           # rewrite all three
    .venv/bin/python bench/readme_table.py --check   # exit 1 when one is out of date

The Meta-World results of docs/metaworld.md (``bench/metaworld.py``'s runs) sit between
``<!-- bench:metaworld:begin -->`` and ``<!-- bench:metaworld:end -->``, those of recording (b)
(the published protocol, ``bench/metaworld_published.py``) between
``<!-- bench:metaworld-b:begin -->`` and ``<!-- bench:metaworld-b:end -->``. The table sits between
the lines ``<!-- bench:begin -->`` and ``<!-- bench:end -->`` of
docs/performance.md, the headline figures between ``<!-- bench:headline:begin -->`` and
``<!-- bench:headline:end -->`` of README.md.
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

from bench.metaworld import LABELS as METAWORLD_LABELS
from bench.metaworld_published import render_published
from bench.metaworld_tables import render_results as render_metaworld
from bench.records import RESULTS, ROOT, read_records

README = ROOT / "README.md"
PERFORMANCE = ROOT / "docs" / "performance.md"
METAWORLD = ROOT / "docs" / "metaworld.md"
METAWORLD_BEGIN = "<!-- bench:metaworld:begin -->"
METAWORLD_END = "<!-- bench:metaworld:end -->"
METAWORLD_B_BEGIN = "<!-- bench:metaworld-b:begin -->"
METAWORLD_B_END = "<!-- bench:metaworld-b:end -->"
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
HEADLINE_BEGIN = "<!-- bench:headline:begin -->"
HEADLINE_END = "<!-- bench:headline:end -->"


class Headline(NamedTuple):
    """A figure the README shows: which records, and what to call it there."""

    bench: str
    figure: str
    label: str


HEADLINES = (
    Headline(
        "learners",
        "5-step-eager-vs-autograd-sinusoid",
        "eager meta-step vs autograd + torch.optim",
    ),
    Headline("learners", "5-step-compiled-sinusoid", "compiled meta-step vs hand-written"),
    Headline("streams", "1-first-epoch", "stream first epoch vs pyarrow"),
    Headline("streams", "2b-steady-epochs-rllib", "steady stream vs RLlib's iterator"),
    Headline("flow", "1-sinusoid-loop", "flow loop vs learner alone"),
    Headline("artifacts", "4-s3-publish-load", "S3 publish + load vs boto3"),
    Headline("metaworld", "summary-reach-context", "Meta-World reach-v3 held-out success"),
    Headline(
        "metaworld", "summary-reach-context-final", "Meta-World reach-v3 success at the last step"
    ),
    Headline(
        "metaworld", "summary-reach-context-gain", "Meta-World reach-v3 adapted minus unadapted"
    ),
    Headline("metaworld", "summary-push-context", "Meta-World push-v3 held-out success"),
    Headline(
        "metaworld",
        "summary-b-reach-context-online",
        "Meta-World reach-v3 normalised return, published protocol, online context",
    ),
    Headline(
        "metaworld",
        "summary-b-push-context-online",
        "Meta-World push-v3 normalised return, published protocol, online context",
    ),
)


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
        return "No records yet: run the bench scripts (see docs/development.md)."
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


def headline_rows(
    rows: list[FigureRow], headlines: tuple[Headline, ...] = HEADLINES
) -> list[tuple[Headline, FigureRow]]:
    """Each headline with the row of its figure whose latest run is the newest; headlines
    without records are left out."""
    chosen = []
    for headline in headlines:
        candidates = [
            row
            for row in rows
            if (row.latest["bench"], row.latest["figure"]) == (headline.bench, headline.figure)
        ]
        if candidates:
            newest = max(candidates, key=lambda row: datetime.fromisoformat(row.latest["date"]))
            chosen.append((headline, newest))
    return chosen


def render_headlines(rows: list[FigureRow], headlines: tuple[Headline, ...] = HEADLINES) -> str:
    """The README's Markdown table of the headline figures."""
    chosen = headline_rows(rows, headlines)
    if not chosen:
        return "No records yet: run the bench scripts (see docs/development.md)."
    lines = [
        "| figure | latest (date) | range (runs) | target | met (runs met) | shape |",
        "|---|---|---|---|---|---|",
    ]
    previous_shape = None
    for headline, row in chosen:
        record = row.latest
        # A figure of the same runs as the row above (reach's three summaries) says so
        # instead of repeating the shape: the front page has a size limit.
        shape = _shape_text(record["shape"])
        shown, previous_shape = ("as above" if shape == previous_shape else shape), shape
        if record["target"] is None:
            met = "report only"
        else:
            met = ("yes" if record["met"] else "**no**") + f" ({row.met_runs}/{row.runs})"
        cells = [
            f"{headline.label} (`{record['bench']}` {record['figure']})",
            f"{_number_text(record)} ({record['date'][:10]})",
            f"{_format(row.low)}–{_format(row.high)} ({row.runs})",
            record["target"] or "none",
            met,
            shown,
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def render_between(text: str, content: str, *, name: str, begin: str, end: str, what: str) -> str:
    """``text`` (the file ``name``) with what lies between the marker lines replaced."""
    counts = text.count(begin), text.count(end)
    if counts != (1, 1):
        found = f"found {counts[0]} of the first and {counts[1]} of the second"
    elif text.index(begin) > text.index(end):
        found = "found the second before the first"
    else:
        found = ""
    if found:
        raise ValueError(
            f"{name} needs one line {begin} and, after it, one line {end} around {what}; {found}"
        )
    before, rest = text.split(begin)
    after = rest.split(end)[1]
    return f"{before}{begin}\n{content}\n{end}{after}"


def render_performance(text: str, table: str) -> str:
    """docs/performance.md's ``text`` with the table between its markers replaced."""
    return render_between(
        text, table, name="docs/performance.md", begin=BEGIN, end=END, what="the table"
    )


def render_readme(text: str, headlines: str) -> str:
    """README.md's ``text`` with the headline figures between their markers replaced."""
    return render_between(
        text,
        headlines,
        name="README.md",
        begin=HEADLINE_BEGIN,
        end=HEADLINE_END,
        what="the headline figures",
    )


def _pages(
    performance: Path, readme: Path, results: Path, metaworld: Path = METAWORLD
) -> dict[Path, tuple[str, str]]:
    """Each generated page: its current text and the text the records give."""
    records = read_records(results)
    rows = figure_rows(records)
    current = {
        performance: performance.read_text(),
        readme: readme.read_text(),
        metaworld: metaworld.read_text(),
    }
    return {
        metaworld: (current[metaworld], _metaworld_page(current[metaworld], records)),
        performance: (
            current[performance],
            render_performance(current[performance], render_table(rows)),
        ),
        readme: (current[readme], render_readme(current[readme], render_headlines(rows))),
    }


def _metaworld_page(text: str, records: list[dict[str, Any]]) -> str:
    """docs/metaworld.md's ``text`` with both results tables regenerated."""
    text = render_between(
        text,
        render_metaworld(records),
        name="docs/metaworld.md",
        begin=METAWORLD_BEGIN,
        end=METAWORLD_END,
        what="the Meta-World results",
    )
    return render_between(
        text,
        render_published(records, METAWORLD_LABELS),
        name="docs/metaworld.md",
        begin=METAWORLD_B_BEGIN,
        end=METAWORLD_B_END,
        what="the Meta-World results of recording (b)",
    )


def check_pages(
    performance: Path = PERFORMANCE,
    readme: Path = README,
    results: Path = RESULTS,
    metaworld: Path = METAWORLD,
) -> str | None:
    """None when every page shows what the records give, else the differences."""
    differences = []
    for page, (current, wanted) in _pages(performance, readme, results, metaworld).items():
        if current != wanted:
            diff = difflib.unified_diff(
                current.splitlines(),
                wanted.splitlines(),
                page.name,
                "from the records",
                lineterm="",
            )
            differences.append(
                f"{page} differs from the records in {results}; regenerate it with "
                "`.venv/bin/python bench/readme_table.py`:\n" + "\n".join(diff)
            )
    return "\n".join(differences) or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    parser.add_argument("--performance", type=Path, default=PERFORMANCE)
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--metaworld", type=Path, default=METAWORLD)
    args = parser.parse_args(argv)
    if args.check:
        difference = check_pages(args.performance, args.readme, args.results, args.metaworld)
        if difference is not None:
            print(difference, file=sys.stderr)
            return 1
        print(f"{args.performance} and {args.readme} match the records in {args.results}")
        return 0
    pages = _pages(args.performance, args.readme, args.results, args.metaworld)
    for page, (_, wanted) in pages.items():
        page.write_text(wanted)
    rows = figure_rows(read_records(args.results))
    print(
        f"wrote {len(rows)} figures into {args.performance} and "
        f"{len(headline_rows(rows))} headline figures into {args.readme} from {args.results}"
    )
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
