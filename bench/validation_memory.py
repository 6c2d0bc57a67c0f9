"""What bounded id checks cost: peak memory of validating 1M and 16M rows within a
``validation_memory_mb`` budget, and MB/s against the in-memory checks on the same data.

Each validation (``inspect_episodes`` with ``check_values=off``: footers, nulls, id checks,
fingerprint) runs in a fresh subprocess that reports its own peak RSS (``VmHWM`` in
``/proc/self/status``), so one measurement never inherits another's peak. Two layouts of
the same rows: ``in-order`` (episodes one after the other, as writers and ``compact``
write them: the bounded checks read once and never sort) and ``shuffled`` (every file's
rows in random order: the bounded checks sort on disk). The bounded budget (64 MB) is below
what the in-memory checks need even for 1M rows (80 bytes a row), so both sizes take the
bounded path; the in-memory figures use the default budget (1024 MB), which 16M rows
exceed, so they are forced with a budget of 4096 MB.

Data: int64 ``eps_id``, episodes of 200 steps, files of 1M rows in row groups of 65,536
(the layout ``offmeta data import`` writes), constant 4-float observations (the id checks
never read them; constants keep the files small). Written with pyarrow into a temporary
directory that is removed after. MB/s counts the id columns in Arrow (``eps_id``, ``t``,
the flags: 12.25 bytes a row), since the files are mostly compressed constants.

Run: ``.venv/bin/python bench/validation_memory.py [SMALL_ROWS LARGE_ROWS]`` (default
1,000,000 and 16,000,000; records are written only for the default sizes).

``bench/validation_memory.py validate [ROWS ...]`` measures what a user runs instead:
``offmeta data validate --validation-memory-mb 200`` (every check, values in full) in a fresh
subprocess on 1M, 8M and 16M rows (the default) of 16 random floats of ``obs`` and
``new_obs``, string episode ids (``ep-N``) and a task column (5 episodes a task): string ids
take the bounded checks' two sorts, and at 1M rows the checks run in memory. Peak RSS of 8M
and 16M against 1M, target <= 1.1: memory within the budget plus a constant, whatever the
rows. Records only for the default sizes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

EPISODE_STEPS = 200
FILE_ROWS = 1_000_000
ROW_GROUP_ROWS = 65_536
OBS_FLOATS = 4
VALIDATE_MB = 200
VALIDATE_SIZES = (1_000_000, 8_000_000, 16_000_000)
BOUNDED_MB = 64.0
IN_MEMORY_MB = 4096.0
LAYOUTS = ("in-order", "shuffled")
DEFAULT_SIZES = (1_000_000, 16_000_000)
_CHILD = """
import json, sys, time
from pipeline.reads.episodes import inspect_episodes
start = time.perf_counter()
info = inspect_episodes(sys.argv[1], check_values="off", validation_memory_mb=float(sys.argv[2]))
seconds = time.perf_counter() - start
status = open("/proc/self/status").read().split("\\n")
peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(json.dumps({"seconds": seconds, "peak_mb": peak_kb / 1024, "episodes": info.num_episodes}))
"""


_VALIDATE_CHILD = """
import sys
from flows.cli import main
code = main(["data", "validate", "--validation-memory-mb", sys.argv[2], sys.argv[1]])
status = open("/proc/self/status").read().split("\\n")
peak_kb = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
print(code, peak_kb / 1024)
"""


def write_dataset(
    directory: Path,
    rows: int,
    *,
    shuffled: bool,
    seed: int = 0,
    obs_floats: int = OBS_FLOATS,
    string_ids: bool = False,
) -> float:
    """``rows`` valid transitions in files of ``FILE_ROWS``; returns the MB of their id
    columns in Arrow (what the id checks read and decode). ``string_ids``: ``eps_id``
    ``ep-N``, a ``task_id`` of 5 episodes each and random observations (else constants)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True)
    id_bytes = 0
    for part, start in enumerate(range(0, rows, FILE_ROWS)):
        index = np.arange(start, min(rows, start + FILE_ROWS))
        if shuffled:
            index = rng.permutation(index)
        step = index % EPISODE_STEPS
        n = len(index)
        episodes = index // EPISODE_STEPS
        if string_ids:
            obs = rng.standard_normal((n, obs_floats), np.float32)
            new_obs = rng.standard_normal((n, obs_floats), np.float32)
            eps_id = pa.array(np.char.add("ep-", episodes.astype(str)))
        else:
            obs = new_obs = np.zeros((n, obs_floats), np.float32)
            eps_id = pa.array(episodes, pa.int64())
        table = pa.table(
            {
                "eps_id": eps_id,
                "t": pa.array(step, pa.int32()),
                "obs": pa.FixedShapeTensorArray.from_numpy_ndarray(obs),
                "actions": pa.array(np.zeros(n, np.int64)),
                "rewards": pa.array(np.zeros(n, np.float32)),
                "terminateds": pa.array(step == EPISODE_STEPS - 1),
                "truncateds": pa.array(np.zeros(n, bool)),
                "new_obs": pa.FixedShapeTensorArray.from_numpy_ndarray(new_obs),
            }
        )
        if string_ids:
            tasks = np.char.add("task-", (episodes // 5).astype(str))
            table = table.append_column("task_id", pa.array(tasks).dictionary_encode())
        pq.write_table(
            table,
            directory / f"part-{part:05d}.parquet",
            row_group_size=ROW_GROUP_ROWS,
            compression="zstd",
        )
        id_bytes += table.select(["eps_id", "t", "terminateds", "truncateds"]).nbytes
    return id_bytes / 1e6


def validate(directory: Path, memory_mb: float) -> dict[str, Any]:
    """One validation in a fresh interpreter: seconds, peak RSS in MB, episodes found."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(directory), str(memory_mb)],
        capture_output=True,
        text=True,
        check=True,
        cwd=root,
        env=env,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(sizes: tuple[int, int]) -> dict[str, Any]:
    """For each layout and size: the bounded and the in-memory validation."""
    figures: dict[str, Any] = {}
    for layout in LAYOUTS:
        for rows in sizes:
            with tempfile.TemporaryDirectory(prefix="offmeta-validation-memory-") as tmp:
                directory = Path(tmp) / "dataset"
                megabytes = write_dataset(directory, rows, shuffled=layout == "shuffled")
                for path, memory_mb in (("bounded", BOUNDED_MB), ("in_memory", IN_MEMORY_MB)):
                    result = validate(directory, memory_mb)
                    assert result["episodes"] == rows // EPISODE_STEPS, result
                    result["mb_s"] = megabytes / result["seconds"]
                    result["megabytes"] = megabytes
                    figures[f"{layout}/{rows}/{path}"] = result
                    print(
                        f"{layout:9s} {rows:>11,} rows {path:9s}: "
                        f"peak {result['peak_mb']:7.1f} MB, "
                        f"{result['seconds']:6.1f} s, {result['mb_s']:6.1f} MB/s "
                        f"({megabytes:.0f} MB of id columns), load {os.getloadavg()[0]:.1f}",
                        flush=True,
                    )
    return figures


def write_records(figures: dict[str, Any], sizes: tuple[int, int]) -> None:
    # Run as a script, the repository root must come first on sys.path for `bench`.
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.records import Baseline, write_record

    small, large = sizes
    for number, layout in enumerate(LAYOUTS, start=1):
        bounded = {rows: figures[f"{layout}/{rows}/bounded"] for rows in sizes}
        in_memory = {rows: figures[f"{layout}/{rows}/in_memory"] for rows in sizes}
        shape = {
            "rows": [small, large],
            "layout": layout,
            "budget_mb": BOUNDED_MB,
            "megabytes": round(bounded[large]["megabytes"], 1),
        }
        details = {key: value for key, value in figures.items() if key.startswith(layout)}
        write_record(
            "validation_memory",
            f"{number}-peak-rss-{layout}",
            f"peak RSS of inspect_episodes (check_values=off) on {large:,} {layout} rows with "
            f"validation_memory_mb={BOUNDED_MB:g}, MB (fresh subprocess, VmHWM)",
            bounded[large]["peak_mb"],
            "MB",
            baseline=Baseline(
                f"the same on {small:,} rows, MB (fresh subprocess, VmHWM)",
                bounded[small]["peak_mb"],
            ),
            target="<= 1.3",
            shape=shape,
            details=details,
        )
        write_record(
            "validation_memory",
            f"{number + len(LAYOUTS)}-mb-s-{layout}",
            f"inspect_episodes (check_values=off) on {large:,} {layout} rows with "
            f"validation_memory_mb={BOUNDED_MB:g} (bounded id checks), MB of id columns "
            "(eps_id, t, flags, in Arrow) per second",
            bounded[large]["mb_s"],
            "MB/s",
            baseline=Baseline(
                f"the same with the id checks in memory (validation_memory_mb={IN_MEMORY_MB:g}, "
                f"peak {in_memory[large]['peak_mb']:.0f} MB), MB/s",
                in_memory[large]["mb_s"],
            ),
            shape=shape,
            details=details,
        )


def measure_validate(sizes: tuple[int, ...]) -> dict[int, float]:
    """Peak RSS (MB) of ``offmeta data validate`` at ``VALIDATE_MB`` for each size."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    peaks = {}
    for rows in sizes:
        with tempfile.TemporaryDirectory(prefix="offmeta-validation-memory-") as tmp:
            directory = Path(tmp) / "dataset"
            write_dataset(directory, rows, shuffled=False, obs_floats=16, string_ids=True)
            done = subprocess.run(
                [sys.executable, "-c", _VALIDATE_CHILD, str(directory), str(VALIDATE_MB)],
                capture_output=True,
                text=True,
                check=True,
                cwd=root,
                env=env,
            )
        code, peak = done.stdout.strip().splitlines()[-1].split()
        assert code == "0", done.stderr
        peaks[rows] = float(peak)
        print(
            f"offmeta data validate --validation-memory-mb {VALIDATE_MB}, {rows:>11,} rows: "
            f"peak {peaks[rows]:7.1f} MB, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
    return peaks


def write_validate_records(peaks: dict[int, float]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.records import Baseline, write_record

    small, *larger = VALIDATE_SIZES
    for number, rows in enumerate(larger, start=2 * len(LAYOUTS) + 1):
        write_record(
            "validation_memory",
            f"{number}-validate-peak-rss-{rows // 1_000_000}m",
            f"peak RSS of offmeta data validate --validation-memory-mb {VALIDATE_MB} on "
            f"{rows:,} rows (16-float obs, string eps_id, task_id, values in full), MB "
            "(fresh subprocess, VmHWM)",
            peaks[rows],
            "MB",
            baseline=Baseline(f"the same on {small:,} rows, MB", peaks[small]),
            target="<= 1.1",
            shape={"rows": list(VALIDATE_SIZES), "budget_mb": VALIDATE_MB, "obs_floats": 16},
            details={"peak_mb": {str(r): p for r, p in peaks.items()}},
        )


def main(sizes: tuple[int, int]) -> None:
    figures = measure(sizes)
    for layout in LAYOUTS:
        peaks = [figures[f"{layout}/{rows}/bounded"]["peak_mb"] for rows in sizes]
        print(
            f"{layout}: bounded peak {sizes[1]:,} / {sizes[0]:,} rows = {peaks[1] / peaks[0]:.2f}"
        )
    if sizes == DEFAULT_SIZES:
        write_records(figures, sizes)


if __name__ == "__main__":
    if sys.argv[1:2] == ["validate"]:
        chosen = tuple(int(a) for a in sys.argv[2:]) or VALIDATE_SIZES
        measured = measure_validate(chosen)
        for rows in chosen[1:]:
            print(
                f"peak {rows:,} / {chosen[0]:,} rows = {measured[rows] / measured[chosen[0]]:.2f}"
            )
        if chosen == VALIDATE_SIZES:
            write_validate_records(measured)
        sys.exit(0)
    given = tuple(int(a) for a in sys.argv[1:3])
    main((given[0], given[1]) if len(given) == 2 else DEFAULT_SIZES)
