"""How fast ``inspect_episodes`` checks a dataset (footers, nulls, episode structure across
files, id counts, fingerprint), in MB/s of Parquet and as a ratio against reading the same
files with plain ``pyarrow.parquet.read_table``, both measured in the same rounds.

Run: ``.venv/bin/python bench/dataset.py [ROWS]`` (default 2,000,000 point-robot rows).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import PointRobotTasks, generate

ROUNDS = 3


def _seconds(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def check_speed(directory: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """Per round, in this order: ``pq.read_table`` of every file, then ``inspect_episodes``
    of the directory. Returns every round's figures (MB/s, and the check's time over the
    read's), so a caller can report the range. ``check_cpu_mb_s`` divides by the process's
    CPU time instead: on a shared machine it says what the check costs when other work
    takes the cores (wall-clock figures then fall with the load)."""
    files = sorted(directory.glob("*.parquet"))
    megabytes = sum(f.stat().st_size for f in files) / 1e6
    inspect_episodes(directory)  # warm the page cache and imports
    read_s, check_s, check_cpu_s = [], [], []
    for _ in range(rounds):
        read_s.append(_seconds(lambda: [pq.read_table(f) for f in files]))
        check_s.append(_seconds(lambda: inspect_episodes(directory)))
        check_cpu_s.append(_seconds(lambda: inspect_episodes(directory), time.process_time))
    return {
        "rows": sum(pq.ParquetFile(f).metadata.num_rows for f in files),
        "files": len(files),
        "megabytes": megabytes,
        "read_table_mb_s": [megabytes / s for s in read_s],
        "check_mb_s": [megabytes / s for s in check_s],
        "check_cpu_mb_s": [megabytes / s for s in check_cpu_s],
        "check_over_read": [c / r for c, r in zip(check_s, read_s, strict=True)],
    }


def _range(values: list[float], digits: int) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def main(rows: int) -> None:
    family = PointRobotTasks()
    tasks = max(1, rows // family.rows_per_task)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        generated = _seconds(
            lambda: generate(family, out, tasks=tasks, heldout_tasks=1, rows_per_file=500_000)
        )
        figures = check_speed(out / "train")
    print(f"rows={figures['rows']} files={figures['files']} bytes={figures['megabytes']:.1f} MB")
    print(f"generate: {generated:.2f} s ({figures['rows'] / generated / 1e6:.2f} M rows/s)")
    print(f"baseline pq.read_table (all columns): {_range(figures['read_table_mb_s'], 0)} MB/s")
    print(f"inspect_episodes (every check): {_range(figures['check_mb_s'], 0)} MB/s")
    print(f"inspect_episodes per CPU second: {_range(figures['check_cpu_mb_s'], 0)} MB")
    print(f"ratio inspect_episodes / read_table time: {_range(figures['check_over_read'], 2)}")

    # Records for the README table (bench/records.py); run as a script, the repository
    # root must come first on sys.path for the `bench` package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.records import Baseline, write_record

    median = statistics.median
    shape = {
        "rows": figures["rows"],
        "files": figures["files"],
        "megabytes": round(figures["megabytes"], 1),
    }
    read_s = figures["megabytes"] / median(figures["read_table_mb_s"])
    write_record(
        "dataset",
        "1-inspect-episodes",
        "inspect_episodes (checks, id-column counts, fingerprint), s (median of 3)",
        figures["megabytes"] / median(figures["check_mb_s"]),
        "s",
        baseline=Baseline("pq.read_table of every file, all columns, s (median of 3)", read_s),
        shape=shape,
        details={k: v for k, v in figures.items() if isinstance(v, list)},
    )
    write_record(
        "dataset",
        "2-check-throughput",
        "inspect_episodes, MB of Parquet per second (median of 3)",
        median(figures["check_mb_s"]),
        "MB/s",
        target=">= 200",
        shape=shape,
        details={"check_cpu_mb_s": figures["check_cpu_mb_s"]},
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)
