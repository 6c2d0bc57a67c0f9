"""How much ``inspect_episodes`` (footer checks, id-column counts, fingerprint) costs,
as a ratio against reading the same files with plain ``pyarrow.parquet.read_table``.

Run: ``.venv/bin/python bench/dataset.py [ROWS]`` (default 2,000,000 point-robot rows).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq

from pipeline.dataset import inspect_episodes
from pipeline.synthetic import PointRobotTasks, generate


def _best_of(repeats: int, fn) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(rows: int) -> None:
    family = PointRobotTasks()
    tasks = max(1, rows // family.rows_per_task)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        start = time.perf_counter()
        generate(family, out, tasks=tasks, heldout_tasks=1, rows_per_file=500_000)
        generated = time.perf_counter() - start
        train = out / "train"
        files = sorted(train.glob("*.parquet"))
        size = sum(f.stat().st_size for f in files)
        baseline = _best_of(3, lambda: [pq.read_table(f) for f in files])
        inspect = _best_of(3, lambda: inspect_episodes(train))
        total = tasks * family.rows_per_task
        print(f"rows={total} files={len(files)} bytes={size / 1e6:.1f} MB")
        print(f"generate: {generated:.2f} s ({total / generated / 1e6:.2f} M rows/s)")
        print(f"baseline pq.read_table (all columns): {baseline:.3f} s")
        print(f"inspect_episodes: {inspect:.3f} s ({size / inspect / 1e6:.0f} MB/s of files)")
        print(f"ratio inspect_episodes / read_table: {inspect / baseline:.2f}")

    # Records for the README table (bench/records.py); run as a script, the repository
    # root must come first on sys.path for the `bench` package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.records import Baseline, write_record

    write_record(
        "dataset",
        "1-inspect-episodes",
        "inspect_episodes (checks, id-column counts, fingerprint), s (best of 3)",
        inspect,
        "s",
        baseline=Baseline("pq.read_table of every file, all columns, s (best of 3)", baseline),
        shape={"rows": total, "files": len(files), "megabytes": round(size / 1e6, 1)},
        details={"inspect_mb_per_s": size / inspect / 1e6},
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2_000_000)
