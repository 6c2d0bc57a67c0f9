"""Many one-row files: validation, a stream epoch and threads per process; then
``compact`` and an epoch of its output against the same rows read from one file.

Data: ``--files`` one-row Parquet files (default 20,000) in the canonical layout
(``part-NNNNN.parquet`` and a ``dataset.json``), episodes of 10 steps over 20 tasks,
4-float ``obs``, int64 actions, written to a temporary directory (deleted afterwards).
Ray is started (and its workers warmed) before any timing, with the environment
``offmeta run`` gives it.

1. ``offmeta data validate DIR`` in a fresh process, seconds. Target <= 30.
2. One stream epoch of the small files (``read_episodes`` + ``split_for_learners``, one
   learner, minibatches of 64): seconds from the stream's creation to its last minibatch
   (validation not included). Target <= 60.
3. The most threads any process of the run held (this process, the validate process,
   Ray's processes and workers; sampled every 0.2 s during 1 and 2). Target <= 64.
4. ``compact`` (report only), then a stream epoch of its output against a stream epoch of
   the same rows written as one file, alternating, ``--rounds`` times (default 3); the
   figure is the median of the rounds' ratios of seconds. Target <= 1.5.

    .venv/bin/python bench/small_files.py [--files 20000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.records import ROOT, Baseline, write_record
from flows.process.runtime import set_quiet_environment

set_quiet_environment()

EPISODE_STEPS = 10
TASKS = 20
MINIBATCH = 64


def write_small_files(directory: Path, files: int) -> pa.Table:
    """``files`` one-row files and their ``dataset.json``; returns all rows as one table."""
    rng = np.random.default_rng(0)
    ids = np.arange(files)
    episodes, steps = ids // EPISODE_STEPS, ids % EPISODE_STEPS
    rows = pa.table(
        {
            "eps_id": pa.array(episodes, pa.int64()),
            "t": pa.array(steps, pa.int32()),
            "obs": pa.FixedShapeTensorArray.from_numpy_ndarray(
                rng.standard_normal((files, 4), dtype=np.float32)
            ),
            "actions": pa.array(rng.integers(0, 2, files), pa.int64()),
            "rewards": pa.array(rng.standard_normal(files, dtype=np.float32)),
            "terminateds": pa.array(steps == EPISODE_STEPS - 1),
            "truncateds": pa.array(np.zeros(files, bool)),
            "task_id": pa.array([f"task-{e % TASKS:03d}" for e in episodes]).dictionary_encode(),
        }
    )
    directory.mkdir(parents=True)
    for index in range(files):
        pq.write_table(rows.slice(index, 1), directory / f"part-{index:05d}.parquet")
    document = {"id": "one-row-files", "num_rows": files}
    (directory / "dataset.json").write_text(json.dumps(document))
    return rows


class ThreadPeak:
    """The most threads held by this process or any process below it (Ray's included),
    sampled by a background thread."""

    def __init__(self, period_s: float = 0.2) -> None:
        self.peak: dict[int, tuple[int, str]] = {}
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="thread-peak", daemon=True)

    def __enter__(self) -> ThreadPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def top(self, count: int = 5) -> list[tuple[int, str]]:
        return sorted(self.peak.values(), reverse=True)[:count]

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in _descendants(os.getpid()):
                threads = _threads(pid)
                if threads > self.peak.get(pid, (0, ""))[0]:
                    self.peak[pid] = (threads, _command(pid))
            self._stop.wait(self._period_s)


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _threads(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ").strip()[:60]
    except OSError:
        return "?"


def validate_seconds(directory: Path) -> tuple[float, str]:
    """Seconds of ``offmeta data validate DIR`` in a fresh process, and its stderr."""
    cli = "import flows.cli; flows.cli.run()"  # what the `offmeta` console script runs
    command = [sys.executable, "-c", cli, "data", "validate", str(directory)]
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"validate failed:\n{done.stderr[-3000:]}")
    return seconds, done.stderr.strip()


def stream_epoch(directory: Path) -> tuple[int, float, float]:
    """Rows, seconds of one stream epoch, and the seconds ``read_episodes`` took first."""
    from pipeline.reads.episodes import read_episodes
    from pipeline.streams.learner_stream import split_for_learners

    start = time.perf_counter()
    episodes = read_episodes(directory)
    validated = time.perf_counter() - start
    start = time.perf_counter()
    [stream] = split_for_learners(episodes, 1, minibatch_size=MINIBATCH, seed=0)
    batches = episodes.num_rows // MINIBATCH
    with stream:
        for _ in stream.take(batches):
            pass
    return batches * MINIBATCH, time.perf_counter() - start, validated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000, help="one-row files")
    parser.add_argument("--rounds", type=int, default=3, help="compacted vs one-file rounds")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="offmeta-bench-small-files-"))
    try:
        run(root, args.files, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(root: Path, files: int, rounds: int) -> None:
    import ray

    from pipeline.writes.compact import compact

    started = time.perf_counter()
    small = root / "small"
    rows = write_small_files(small, files)
    one_file = root / "one-file"
    one_file.mkdir()
    pq.write_table(rows, one_file / "part-00000.parquet")
    os.sync()
    print(f"wrote {files:,} one-row files ({time.perf_counter() - started:.1f} s)")
    shape = {"files": files, "rows": files, "obs_floats": 4, "minibatch": MINIBATCH}

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        stream_epoch(one_file)  # start and warm Ray's workers
        with ThreadPeak() as threads:
            validate_s, warning = validate_seconds(small)
            epoch_rows, epoch_s, read_episodes_s = stream_epoch(small)
        top = threads.top()
        started = time.perf_counter()
        compact(small, root / "compacted")
        compact_s = time.perf_counter() - started
        # Alternating rounds, and the median of their ratios: this machine is shared.
        pairs = [
            (stream_epoch(root / "compacted")[1], stream_epoch(one_file)[1]) for _ in range(rounds)
        ]
    finally:
        ray.shutdown()

    ratios = sorted(compacted / single for compacted, single in pairs)
    ratio = ratios[len(ratios) // 2]
    compacted_s, single_s = sorted(pairs, key=lambda p: p[0] / p[1])[len(pairs) // 2]
    print(f"\n1. validate {files:,} one-row files: {validate_s:.1f} s (target <= 30)")
    print(f"   its warning: {warning}")
    print(f"2. one stream epoch of them: {epoch_s:.1f} s, {epoch_rows / epoch_s:,.0f} rows/s")
    print(f"   (target <= 60; read_episodes before it: {read_episodes_s:.1f} s)")
    print(f"3. most threads in one process: {top[0][0]} (target <= 64)")
    for count, command in top:
        print(f"   {count:4d}  {command}")
    print(f"4. compact: {compact_s:.1f} s; epoch of its output / one file: {ratio:.2f}")
    per_round = ", ".join(f"{c / s:.2f}" for c, s in pairs)
    print(f"   (target <= 1.5) median round {compacted_s:.2f} s / {single_s:.2f} s; {per_round}")

    write_record(
        "small-files",
        "1-validate",
        "offmeta data validate of the one-row files, in a fresh process",
        validate_s,
        "s",
        target="<= 30",
        shape=shape,
        details={"warning": warning},
    )
    write_record(
        "small-files",
        "2-stream-epoch",
        "one stream epoch of the one-row files (validation excluded)",
        epoch_s,
        "s",
        target="<= 60",
        shape=shape,
        details={"rows": epoch_rows, "read_episodes_s": read_episodes_s},
    )
    write_record(
        "small-files",
        "3-max-threads",
        "most threads held by one process during 1 and 2 (sampled every 0.2 s)",
        top[0][0],
        "threads",
        target="<= 64",
        shape=shape,
        details={"top_processes": [{"threads": c, "command": n} for c, n in top]},
    )
    write_record(
        "small-files",
        "4-compacted-epoch",
        "stream epoch of the compacted dataset, seconds (median round); ratio: median of the "
        "rounds' ratios",
        compacted_s,
        "s",
        baseline=Baseline("stream epoch of the same rows written as one file, seconds", single_s),
        ratio=ratio,
        target="<= 1.5",
        shape={**shape, "rounds": rounds},
        details={"compact_s": compact_s, "round_ratios": [c / s for c, s in pairs]},
    )


if __name__ == "__main__":
    main()
