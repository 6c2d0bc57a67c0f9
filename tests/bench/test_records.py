"""Benchmark records (bench/records.py) and the pages generated from them
(bench/readme_table.py): docs/performance.md's table and the README's headline figures are
what the committed records give."""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pyarrow
import pytest
import ray
import torch

from bench.readme_table import (
    BEGIN,
    END,
    HEADLINE_BEGIN,
    HEADLINE_END,
    METAWORLD_B_BEGIN,
    METAWORLD_B_END,
    METAWORLD_BEGIN,
    METAWORLD_END,
    Headline,
    check_pages,
    figure_rows,
    headline_rows,
    main,
    render_headlines,
    render_performance,
    render_readme,
)
from bench.records import REQUIRED, Baseline, meets, read_records, write_record
from tests.helpers.paths import REPO

ROOT = REPO


def test_the_pages_are_what_the_records_give():
    assert check_pages() is None


def test_the_readme_shows_the_headline_figures_that_have_records():
    rows = figure_rows(read_records())
    assert [headline.figure for headline, _ in headline_rows(rows)] == [
        "5-step-eager-vs-autograd-sinusoid",
        "5-step-compiled-sinusoid",
        "1-first-epoch",
        "2b-steady-epochs-rllib",
        "1-sinusoid-loop",
        "4-s3-publish-load",
        "summary-reach-context",
        "summary-reach-context-final",
        "summary-reach-context-gain",
        "summary-push-context",
        "summary-b-reach-context-online",
        "summary-b-push-context-online",
    ]


def test_the_committed_records_cover_every_bench_script():
    # A record's bench name is its script's name, '_' kept (offline_rl) or written '-'
    # (small-files): record names are lower-case letters, digits, '-' and '_'.
    benches = {record["bench"] for record in read_records()}
    # metaworld_validation, metaworld_published and metaworld_tables are bench/metaworld.py's
    # validation split, recording (b) and docs tables, recorded by that script.
    helpers = {
        "records",
        "readme_table",
        "metaworld_validation",
        "metaworld_published",
        "metaworld_tables",
    }
    scripts = {path.stem for path in (ROOT / "bench").glob("*.py")} - helpers
    named = {script: {script, script.replace("_", "-")} & benches for script in scripts}
    assert {script: len(names) for script, names in named.items()} == dict.fromkeys(scripts, 1)
    assert benches == set().union(*named.values())


def _write(directory: Path, ratio_value: float, **overrides) -> Path:
    arguments = {
        "shape": {"rows": 100},
        "baseline": Baseline("plain reading", 2.0),
        "target": ">= 0.5",
        "directory": directory,
    } | overrides
    return write_record(
        "demo", "1-read", "reading, rows/s", ratio_value * 2.0, "rows/s", **arguments
    )


def test_a_record_holds_the_figure_its_baseline_and_the_machine(tmp_path):
    before = datetime.now(UTC)
    path = _write(tmp_path, 0.75, details={"rounds": [0.7, 0.8]})
    assert re.fullmatch(r"demo-\d{8}T\d{6}\.\d{6}Z-1-read\.json", path.name)
    record = json.loads(path.read_text())
    assert set(REQUIRED) | {"details"} == record.keys()
    assert {k: record[k] for k in ("bench", "figure", "description", "value", "unit")} == {
        "bench": "demo",
        "figure": "1-read",
        "description": "reading, rows/s",
        "value": 1.5,
        "unit": "rows/s",
    }
    assert record["baseline"] == {"description": "plain reading", "value": 2.0}
    assert (record["ratio"], record["target"], record["met"]) == (0.75, ">= 0.5", True)
    assert record["shape"] == {"rows": 100}
    assert record["details"] == {"rounds": [0.7, 0.8]}
    machine = record["machine"]
    assert machine["cores"] == os.cpu_count()
    assert machine["device"] == "cpu"
    assert machine["ram_bytes"] == os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert machine["cpu"] and isinstance(machine["load_average_1m"], float)
    assert record["software"] == {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "pyarrow": pyarrow.__version__,
    }
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert record["git"]["revision"] == head.stdout.strip()
    assert isinstance(record["git"]["dirty"], bool)
    assert before <= datetime.fromisoformat(record["date"]) <= datetime.now(UTC)


def test_the_target_applies_to_the_ratio_or_without_a_baseline_to_the_value(tmp_path):
    missed = json.loads(_write(tmp_path, 0.25).read_text())
    assert (missed["ratio"], missed["met"]) == (0.25, False)
    plain = write_record(
        "demo", "2-loss", "loss", 0.3, "MSE", shape={}, target="<= 0.40", directory=tmp_path
    )
    plain_record = json.loads(plain.read_text())
    assert (plain_record["baseline"], plain_record["ratio"], plain_record["met"]) == (
        None,
        None,
        True,
    )
    report = json.loads(_write(tmp_path, 3.0, target=None).read_text())
    assert (report["target"], report["met"]) == (None, None)
    given = json.loads(_write(tmp_path, 1.0, ratio=0.6).read_text())
    assert (given["value"], given["ratio"]) == (2.0, 0.6)
    assert meets(1.10, "<= 1.10") and not meets(1.11, "<=1.10") and meets(6, ">= 6")


def test_records_are_appended_never_rewritten(tmp_path):
    first = _write(tmp_path, 0.5)
    text = first.read_text()
    second = _write(tmp_path, 0.9)
    assert sorted(tmp_path.iterdir()) == sorted([first, second])
    assert first.read_text() == text
    assert [r["ratio"] for r in read_records(tmp_path)] == [0.5, 0.9]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"bench": "Demo Bench"},
            "record bench 'Demo Bench' is not a name: use lower-case letters, digits, '-' and '_' "
            "(it becomes part of the file name)",
        ),
        ({"value": float("nan")}, "demo/1-read value must be a finite number, got nan"),
        (
            {"baseline": Baseline("empty", 0.0)},
            "demo/1-read: the baseline value is 0, so value / baseline has no ratio; pass "
            "ratio= explicitly or choose a baseline that is not 0",
        ),
        (
            {"baseline": None, "ratio": 2.0},
            "demo/1-read: a ratio of 2.0 was given without a baseline; pass "
            "baseline=Baseline(description, value) measured in the same run",
        ),
        (
            {"target": "at least 0.5"},
            "target 'at least 0.5' is not a bound: write '<= NUMBER' or '>= NUMBER'",
        ),
    ],
)
def test_bad_records_are_refused_and_nothing_is_written(tmp_path, overrides, message):
    arguments = {
        "bench": "demo",
        "figure": "1-read",
        "description": "reading",
        "value": 1.0,
        "unit": "rows/s",
        "shape": {},
        "baseline": Baseline("plain", 2.0),
        "target": ">= 0.5",
        "directory": tmp_path / "results",
    } | overrides
    with pytest.raises(ValueError) as error:
        write_record(**arguments)
    assert str(error.value) == message
    assert not (tmp_path / "results").exists()


def test_a_broken_record_is_named(tmp_path):
    (tmp_path / "demo-x.json").write_text('{"bench": "demo"}')
    with pytest.raises(ValueError) as error:
        read_records(tmp_path)
    assert str(error.value) == (
        f"{tmp_path / 'demo-x.json'}: a record is a JSON object with the fields "
        f"{', '.join(REQUIRED)}; missing: {', '.join(REQUIRED[1:])}"
    )


def test_a_row_holds_the_latest_run_and_the_range_over_every_run(tmp_path):
    for ratio in (0.6, 0.4, 0.9, 0.7):
        _write(tmp_path, ratio)
    _write(tmp_path, 0.2, shape={"rows": 10})  # another shape: a row of its own
    rows = figure_rows(read_records(tmp_path))
    assert [
        (r.latest["shape"], r.latest["ratio"], r.low, r.high, r.runs, r.met_runs) for r in rows
    ] == [
        ({"rows": 100}, 0.7, 0.4, 0.9, 4, 3),
        ({"rows": 10}, 0.2, 0.2, 0.2, 1, 0),
    ]


def _performance(tmp_path: Path, table: str) -> Path:
    page = tmp_path / "performance.md"
    page.write_text(f"# demo\n\n## Performance\n\n{BEGIN}\n{table}\n{END}\n\n## Next\n")
    return page


def _readme(tmp_path: Path, figures: str) -> Path:
    readme = tmp_path / "README.md"
    readme.write_text(f"# demo\n\n{HEADLINE_BEGIN}\n{figures}\n{HEADLINE_END}\n\n## Next\n")
    return readme


def test_the_table_is_regenerated_between_the_markers_and_checked(tmp_path, capsys):
    results = tmp_path / "results"
    for ratio in (0.6, 0.4):
        _write(results, ratio)
    write_record("demo", "2-loss", "loss | MSE", 0.3, "MSE", shape={}, directory=results)
    write_record(
        "flow",
        "1-sinusoid-loop",
        "loop it/s",
        1.8,
        "it/s",
        shape={"iterations": 1000},
        baseline=Baseline("learner alone", 2.0),
        target=">= 0.9",
        directory=results,
    )
    page = _performance(tmp_path, "| typed by hand | 0.99 |")
    readme = _readme(tmp_path, "| typed by hand | 0.99 |")
    metaworld = tmp_path / "metaworld.md"
    metaworld.write_text(
        f"# ML1\n\n{METAWORLD_BEGIN}\n{METAWORLD_END}\n\n{METAWORLD_B_BEGIN}\n{METAWORLD_B_END}\n"
    )
    arguments = ["--performance", str(page), "--readme", str(readme), "--results", str(results)]
    arguments += ["--metaworld", str(metaworld)]
    assert main(["--check", *arguments]) == 1
    error = capsys.readouterr().err
    assert f"{page} differs from the records" in error
    assert f"{readme} differs from the records" in error
    assert main(arguments) == 0
    assert main(["--check", *arguments]) == 0
    assert "No records yet" in metaworld.read_text()  # no metaworld records in results
    assert "No recording (b) records yet" in metaworld.read_text()
    assert readme.read_text() == (
        f"# demo\n\n{HEADLINE_BEGIN}\n"
        "| figure | latest (date) | range (runs) | target | met (runs met) | shape |\n"
        "|---|---|---|---|---|---|\n"
        "| flow loop vs learner alone (`flow` 1-sinusoid-loop) "
        f"| 0.9 ({read_records(results)[-1]['date'][:10]}) | 0.9–0.9 (1) | >= 0.9 | yes (1/1) "
        f"| iterations 1,000 |\n{HEADLINE_END}\n\n## Next\n"
    )
    text = page.read_text()
    assert text.startswith(f"# demo\n\n## Performance\n\n{BEGIN}\n| bench |")
    assert text.endswith(f"{END}\n\n## Next\n")
    date = read_records(results)[-2]["date"][:10]
    lines = text.splitlines()
    assert lines[7].startswith(
        "| `demo` | 1-read: reading, rows/s | plain reading | rows 100 | 0.4 ("
    )
    assert lines[7].endswith(" | 0.4–0.6 (2) | >= 0.5 | **no** (1/2) | M1 |")
    assert lines[8].startswith("| `demo` | 2-loss: loss \\| MSE | none | ")
    assert f"| 0.3 MSE ({date}, " in lines[8]
    assert lines[8].endswith(" | 0.3–0.3 (1) | none | report only | M1 |")
    assert lines[9].startswith("| `flow` | 1-sinusoid-loop: loop it/s | learner alone | ")
    assert lines[11].startswith(f"M1: {os.cpu_count()} cores, ")
    assert lines[11].endswith(
        f"device cpu; pyarrow {pyarrow.__version__}, python {platform.python_version()}, "
        f"ray {ray.__version__}, torch {torch.__version__}"
    )
    assert lines[12].startswith("load: the machine's 1-minute load average")


def test_a_headline_shows_the_row_of_its_figure_whose_latest_run_is_newest(tmp_path):
    _write(tmp_path, 0.6, shape={"rows": 100})
    _write(tmp_path, 0.8, shape={"rows": 10})  # newer: the headline's row
    _write(tmp_path, 0.7, shape={"rows": 10})
    rows = figure_rows(read_records(tmp_path))
    headlines = (Headline("demo", "1-read", "reading"), Headline("demo", "9-none", "nothing"))
    assert [(h.label, r.latest["shape"], r.runs) for h, r in headline_rows(rows, headlines)] == [
        ("reading", {"rows": 10}, 2)
    ]
    assert (
        render_headlines(rows, headlines)
        .splitlines()[2]
        .startswith("| reading (`demo` 1-read) | 0.7 (")
    )
    assert render_headlines([], headlines) == (
        "No records yet: run the bench scripts (see docs/development.md)."
    )


def test_a_headline_of_the_same_runs_as_the_row_above_says_as_above(tmp_path):
    for figure, shape in (("1-a", {"rows": 10}), ("2-b", {"rows": 10}), ("3-c", {"rows": 5})):
        write_record("demo", figure, figure, 1.0, "rows/s", shape=shape, directory=tmp_path)
    headlines = tuple(Headline("demo", f, f) for f in ("1-a", "2-b", "3-c"))
    shapes = [
        line.rsplit("|", 2)[1].strip()
        for line in render_headlines(figure_rows(read_records(tmp_path)), headlines).splitlines()[
            2:
        ]
    ]
    assert shapes == ["rows 10", "as above", "rows 5"]


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("no markers", "found 0 of the first and 0 of the second"),
        (f"{END}\n{BEGIN}\n", "found the second before the first"),
        (f"{BEGIN}\n{BEGIN}\n{END}\n", "found 2 of the first and 1 of the second"),
    ],
)
def test_a_page_without_one_pair_of_markers_is_refused(text, found):
    with pytest.raises(ValueError) as error:
        render_performance(text, "table")
    assert str(error.value) == (
        f"docs/performance.md needs one line {BEGIN} and, after it, one line {END} around "
        f"the table; {found}"
    )
    headline_text = text.replace(BEGIN, HEADLINE_BEGIN).replace(END, HEADLINE_END)
    with pytest.raises(ValueError) as error:
        render_readme(headline_text, "figures")
    assert str(error.value) == (
        f"README.md needs one line {HEADLINE_BEGIN} and, after it, one line {HEADLINE_END} "
        f"around the headline figures; {found}"
    )
