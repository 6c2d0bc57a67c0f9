"""What the value checks cost: ``inspect_episodes`` in MB of Parquet per second with
``check_values`` ``full`` and ``sample`` against ``off`` (footers, nulls, ``dataset.json``,
id checks and fingerprint: everything validation did before the value checks), all three
measured in the same rounds, on one generated dataset.

The dataset is what the scan is hardest on: 16-float ``obs`` and ``new_obs``, 2-float
actions under a bounded box (``dataset.json``), float32 rewards, random values (zstd cannot
shrink them, so every byte read is a byte decoded), episodes of 200 steps, 4 files of
65,536-row row groups (the layout ``offmeta data import`` and ``compact`` write).

Run: ``.venv/bin/python bench/validation.py [ROWS]`` (default 1,000,000 rows).
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract.value_checks import SAMPLE_EVERY
from pipeline.reads.episodes import inspect_episodes

ROUNDS = 3
OBS_FLOATS = 16
ACTION_FLOATS = 2
EPISODE_STEPS = 200
FILES = 4
ROW_GROUP_ROWS = 65_536
MODES = ("off", "full", "sample")


def write_dataset(directory: Path, rows: int, seed: int = 0) -> None:
    """``rows`` valid transitions in ``FILES`` files and a ``dataset.json`` with a box."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, rows, FILES + 1).astype(int)
    for part, (start, stop) in enumerate(itertools.pairwise(bounds)):
        n = int(stop - start)
        index = np.arange(start, stop)
        step = index % EPISODE_STEPS
        table = pa.table(
            {
                "eps_id": pa.array(index // EPISODE_STEPS, pa.int64()),
                "t": pa.array(step, pa.int32()),
                "obs": _tensor(rng.standard_normal((n, OBS_FLOATS), np.float32)),
                "actions": _tensor(rng.uniform(-1, 1, (n, ACTION_FLOATS)).astype(np.float32)),
                "rewards": pa.array(rng.standard_normal(n, np.float32)),
                "terminateds": pa.array(step == EPISODE_STEPS - 1),
                "truncateds": pa.array(np.zeros(n, bool)),
                "new_obs": _tensor(rng.standard_normal((n, OBS_FLOATS), np.float32)),
            }
        )
        pq.write_table(
            table,
            directory / f"part-{part:05d}.parquet",
            row_group_size=ROW_GROUP_ROWS,
            compression="zstd",
            use_dictionary=["eps_id", "t"],
        )
    space = {"kind": "box", "shape": [ACTION_FLOATS], "low": -1.0, "high": 1.0}
    document = {"id": "validation-bench", "action_space": space, "num_rows": rows}
    (directory / "dataset.json").write_text(json.dumps(document))


def _tensor(values: np.ndarray) -> pa.Array:
    return pa.FixedShapeTensorArray.from_numpy_ndarray(values)


def _seconds(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    start = clock()
    fn()
    return clock() - start


def check_speed(directory: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    """Per round, ``inspect_episodes`` with each of ``MODES`` in turn, wall clock and CPU
    time; every round's MB/s, so a caller can report the range, and the time of ``full``
    and ``sample`` over ``off`` per round."""
    files = sorted(directory.glob("*.parquet"))
    megabytes = sum(f.stat().st_size for f in files) / 1e6
    inspect_episodes(directory)  # warm the page cache and imports
    wall: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    for _ in range(rounds):
        for mode in MODES:
            check = functools.partial(inspect_episodes, directory, check_values=mode)
            wall[mode].append(_seconds(check))
            cpu[mode].append(_seconds(check, time.process_time))
    figures: dict[str, Any] = {
        "rows": sum(pq.ParquetFile(f).metadata.num_rows for f in files),
        "files": len(files),
        "megabytes": megabytes,
    }
    for mode in MODES:
        figures[f"{mode}_mb_s"] = [megabytes / s for s in wall[mode]]
        figures[f"{mode}_cpu_mb_s"] = [megabytes / s for s in cpu[mode]]
    for mode in ("full", "sample"):
        figures[f"{mode}_over_off"] = [a / b for a, b in zip(wall[mode], wall["off"], strict=True)]
    return figures


def _range(values: list[float], digits: int) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def main(rows: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "dataset"
        write_dataset(directory, rows)
        figures = check_speed(directory)
    print(f"rows={figures['rows']} files={figures['files']} bytes={figures['megabytes']:.1f} MB")
    for mode in MODES:
        print(
            f"inspect_episodes check_values={mode}: {_range(figures[f'{mode}_mb_s'], 0)} MB/s "
            f"({_range(figures[f'{mode}_cpu_mb_s'], 0)} MB per CPU second)"
        )
    for mode in ("full", "sample"):
        print(f"time {mode} / off: {_range(figures[f'{mode}_over_off'], 2)}")

    # Records for the README table (bench/records.py); run as a script, the repository
    # root must come first on sys.path for the `bench` package.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.records import Baseline, write_record

    median = statistics.median
    shape = {
        "rows": figures["rows"],
        "files": figures["files"],
        "megabytes": round(figures["megabytes"], 1),
        "obs_floats": OBS_FLOATS,
    }
    baseline = Baseline(
        "inspect_episodes, check_values=off (footers, nulls, ids, fingerprint), MB/s (median of 3)",
        median(figures["off_mb_s"]),
    )
    for number, mode, what in (
        (1, "full", "every row group"),
        (2, "sample", f"one row group in {SAMPLE_EVERY}"),
    ):
        write_record(
            "validation",
            f"{number}-check-values-{mode}",
            f"inspect_episodes with check_values={mode} (NaN/inf, action space; {what}), MB of "
            "Parquet per second (median of 3)",
            median(figures[f"{mode}_mb_s"]),
            "MB/s",
            baseline=baseline,
            shape=shape,
            details={
                key: value
                for key, value in figures.items()
                if isinstance(value, list) and (key.startswith(mode) or key.startswith("off"))
            },
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
