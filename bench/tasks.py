"""Task samples larger than memory: streaming in windows against the in-memory path.

Data: tasks of 200 transitions (10 episodes of 20 steps), rows sorted by (task, episode, t)
as ``offmeta data compact`` writes them, 16-float ``obs`` and ``new_obs``, 4-float
``actions``: 150 bytes per row in memory. Files of 262,144 rows in row groups of 65,536,
written to a temporary directory (deleted afterwards). K = Q = 10, meta-batches of 25
tasks. The budget is ``--budget-mb`` (default 64); "1x" is a dataset whose selected
columns take the budget in memory, "8x" eight times that.

1. Peak RSS of a fresh process that reads the 8x dataset and iterates one epoch of
   meta-batches with ``tasks.mode: auto`` (which streams it), divided by the same for the
   1x dataset (which auto mode reads into memory). Target <= 1.3.
2. The same with both datasets streamed (``mode="stream"``): how memory follows the
   dataset's size when only the window is held. Report only.
3. Training meta-batches/s (one MAML ``MetaLearner.step`` per meta-batch: 16 -> 40 -> 40
   -> 4 MLP, one inner SGD step, vmapped over the 25 tasks) over ``--epochs`` epochs
   (default 1) of the 1x dataset streamed in windows of the budget, divided by the same
   from memory (read once beforehand, not timed); the median of ``--rounds`` rounds'
   ratios (default 3), rounds interleaved. Target >= 0.7.
4. The same without a learner (meta-batches only taken from the stream): the data path
   alone, where every streamed epoch decodes the Parquet files again and the in-memory
   path only gathers rows. Report only.

Each child process starts Ray as ``offmeta run`` does before reading, so that both sides of
a ratio pay the same fixed costs.

    .venv/bin/python bench/tasks.py [--budget-mb 64] [--epochs 2] [--rounds 3]

A few minutes on a busy 2-core machine. Each figure is written as a record
(``bench/records.py``) whose shape names the budget and rows.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from bench.records import Baseline, write_record
from flows.process.runtime import set_quiet_environment

set_quiet_environment()
torch.set_num_threads(1)  # 2 cores: a second intra-op thread slows small meta-steps

SUPPORT = QUERY = 10
META_BATCH = 25
TASK_ROWS = 200
EPISODE_ROWS = 20
FILE_ROWS = 262_144
ROW_GROUP_ROWS = 65_536
ROW_BYTES = 4 * 16 + 4 * 16 + 4 * 4 + 4 + 1 + 1  # obs, new_obs, actions, rewards, flags


def write_dataset(directory: Path, rows: int, seed: int) -> Path:
    """``rows`` transitions (whole tasks) sorted by (task, episode, t), one file at a time."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    rows -= rows % TASK_ROWS
    for index, first in enumerate(range(0, rows, FILE_ROWS)):
        ids = np.arange(first, min(first + FILE_ROWS, rows))
        count = len(ids)
        step = ids % EPISODE_ROWS
        tasks = pa.array([f"task-{task:07d}" for task in ids // TASK_ROWS]).dictionary_encode()
        table = pa.table(
            {
                "eps_id": pa.array(ids // EPISODE_ROWS, pa.int64()),
                "t": pa.array(step, pa.int32()),
                "obs": _tensor(rng.standard_normal((count, 16), dtype=np.float32)),
                "new_obs": _tensor(rng.standard_normal((count, 16), dtype=np.float32)),
                "actions": _tensor(rng.standard_normal((count, 4), dtype=np.float32)),
                "rewards": pa.array(rng.standard_normal(count, dtype=np.float32)),
                "terminateds": pa.array(step == EPISODE_ROWS - 1),
                "truncateds": pa.array(np.zeros(count, bool)),
                "task_id": tasks,
            }
        )
        pq.write_table(
            table, directory / f"part-{index:05d}.parquet", row_group_size=ROW_GROUP_ROWS
        )
    return directory


def _tensor(values: np.ndarray) -> pa.Array:
    return pa.FixedShapeTensorArray.from_numpy_ndarray(values)


def _start_ray() -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def iterate(samples, epochs: int, learner=None) -> tuple[int, float]:
    """Meta-batches taken and seconds for ``epochs`` epochs of one learner's stream, each
    given to ``learner.step`` when there is a learner."""
    from pipeline.streams.learner_stream import split_for_learners

    per_epoch = samples.samples_per_epoch // META_BATCH
    [stream] = split_for_learners(samples, 1, minibatch_size=META_BATCH, seed=0)
    with stream:
        start = time.perf_counter()
        for meta_batch in stream.take(per_epoch * epochs):
            if learner is not None:
                learner.step(meta_batch)
        return per_epoch * epochs, time.perf_counter() - start


def _learner():
    from learners import MetaLearner

    module = {"obs_dim": 16, "action_dim": 4, "model": {"hidden_sizes": [40, 40]}}
    return MetaLearner(
        {
            "algorithm": "maml",
            "modules": {"default_policy": module},
            "inner": {"lr": 0.01, "steps": 1},
        }
    )


def rss_child(directory: Path, mode: str, budget_mb: float) -> None:
    """In a fresh process: read ``directory`` as training does, iterate one epoch, print
    the peak RSS in bytes and what the task samples were."""
    import ray

    from pipeline.reads.episodes import read_episodes
    from pipeline.tasks.samples import task_samples

    _start_ray()
    try:
        samples = task_samples(
            read_episodes(directory),
            support=SUPPORT,
            query=QUERY,
            mode=mode,
            memory_budget_mb=budget_mb,
        )
        batches, seconds = iterate(samples, 1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        summary = samples.summary()
        print(json.dumps({"peak_rss": peak, "batches": batches, "seconds": seconds, **summary}))
    finally:
        ray.shutdown()


def peak_rss(directory: Path, mode: str, budget_mb: float) -> dict:
    command = [
        sys.executable,
        __file__,
        "--rss-child",
        str(directory),
        "--mode",
        mode,
        "--budget-mb",
        str(budget_mb),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"peak RSS run failed for {directory}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def throughput(directory: Path, budget_mb: float, epochs: int, rounds: int) -> dict:
    """Meta-batches/s streamed and from memory, with and without a learner, rounds
    interleaved."""
    import ray

    from pipeline.reads.episodes import read_episodes
    from pipeline.tasks.samples import task_samples

    _start_ray()
    try:
        episodes = read_episodes(directory)
        options = {"support": SUPPORT, "query": QUERY, "memory_budget_mb": budget_mb}
        sources = {
            "stream": task_samples(episodes, mode="stream", **options),
            "memory": task_samples(episodes, mode="memory", **options),
        }
        learner = _learner()
        for samples in sources.values():  # warm-up: imports, page cache, first allocations
            iterate(samples, 1)
        rates: dict[str, list[float]] = {
            f"{name}-{kind}": [] for name in sources for kind in ("train", "data")
        }
        for _ in range(rounds):
            for name, samples in sources.items():
                for kind, stepper in (("train", learner), ("data", None)):
                    batches, seconds = iterate(samples, epochs, stepper)
                    rates[f"{name}-{kind}"].append(batches / seconds)
        return {
            kind: {
                "ratios": [
                    s / m
                    for s, m in zip(rates[f"stream-{kind}"], rates[f"memory-{kind}"], strict=True)
                ],
                "stream": statistics.median(rates[f"stream-{kind}"]),
                "memory": statistics.median(rates[f"memory-{kind}"]),
            }
            for kind in ("train", "data")
        } | {"windows": sources["stream"].summary()["windows"]}
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget-mb", type=float, default=64.0, help="tasks.memory_budget_mb")
    parser.add_argument("--epochs", type=int, default=1, help="timed epochs per round")
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (median)")
    parser.add_argument("--rss-child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child is not None:
        rss_child(args.rss_child, args.mode, args.budget_mb)
        return
    budget = args.budget_mb
    one_x = int(budget * 2**20 // ROW_BYTES)
    root = Path(tempfile.mkdtemp(prefix="offmeta-bench-tasks-"))
    try:
        started = time.perf_counter()
        small = write_dataset(root / "1x", one_x, seed=0)
        large = write_dataset(root / "8x", 8 * one_x, seed=1)
        print(f"wrote {one_x:,} + {8 * one_x:,} rows ({time.perf_counter() - started:.1f} s)")
        runs = {
            (name, mode): peak_rss(directory, mode, budget)
            for mode in ("auto", "stream")
            for name, directory in (("1x", small), ("8x", large))
        }
        speed = throughput(small, budget, args.epochs, args.rounds)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report(runs, speed, budget, args.epochs, args.rounds)


def report(runs: dict, speed: dict, budget: float, epochs: int, rounds: int) -> None:
    shape = {
        "budget_mb": budget,
        "rows_1x": runs["1x", "auto"]["rows"],
        "rows_8x": runs["8x", "auto"]["rows"],
        "row_bytes": ROW_BYTES,
        "support": SUPPORT,
        "query": QUERY,
        "meta_batch": META_BATCH,
    }
    for figure, mode, target, what in (
        ("1-peak-rss-auto", "auto", "<= 1.3", "tasks.mode auto"),
        ("2-peak-rss-streamed", "stream", None, "both streamed"),
    ):
        small, large = runs["1x", mode], runs["8x", mode]
        ratio = large["peak_rss"] / small["peak_rss"]
        print(f"\n{figure}: 8x / 1x peak RSS {ratio:.2f} (target {target or 'none'}), {what}")
        for name, run in (("1x", small), ("8x", large)):
            print(
                f"  {name}: {run['peak_rss'] / 2**20:.0f} MiB, {run['mode']}, "
                f"{run.get('windows', 1)} window(s), {run['batches']} meta-batches in "
                f"{run['seconds']:.1f} s"
            )
        write_record(
            "tasks",
            figure,
            f"peak RSS of a process iterating one epoch of the 8x dataset ({what})",
            large["peak_rss"] / 2**20,
            "MiB",
            baseline=Baseline(
                f"the same for the 1x dataset ({small['mode']})", small["peak_rss"] / 2**20
            ),
            target=target,
            shape=shape,
            details={"modes": {"1x": small["mode"], "8x": large["mode"]}},
        )
    for figure, kind, target, what in (
        ("3-training-meta-batches-per-s", "train", ">= 0.7", "training (a MAML step each)"),
        ("4-data-meta-batches-per-s", "data", None, "the data path alone (no learner)"),
    ):
        measured = speed[kind]
        ratio = statistics.median(measured["ratios"])
        print(f"\n{figure}: stream / memory {ratio:.2f} (target {target or 'none'}), {what}")
        print(
            f"  streamed ({speed['windows']} windows): {measured['stream']:.0f} meta-batches/s, "
            f"in memory: {measured['memory']:.0f} meta-batches/s (medians of {rounds} rounds "
            f"of {epochs} epoch(s)); per-round ratios "
            + ", ".join(f"{r:.2f}" for r in measured["ratios"])
        )
        write_record(
            "tasks",
            figure,
            f"meta-batches/s, {what}, streaming the 1x dataset in windows (median of the "
            "rounds); ratio: median of the rounds' ratios",
            measured["stream"],
            "meta-batches/s",
            baseline=Baseline(
                f"meta-batches/s, {what}, from memory (read beforehand)", measured["memory"]
            ),
            ratio=ratio,
            target=target,
            shape={**shape, "epochs": epochs, "rounds": rounds, "windows": speed["windows"]},
            details={"round_ratios": measured["ratios"]},
        )


if __name__ == "__main__":
    main()
