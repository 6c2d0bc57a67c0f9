"""Scale-out on Ray Train: the driver holds no dataset, and a worker's meta-batches cost
what an in-process learner's do.

Data: ``bench/tasks.py``'s layout (tasks of 200 transitions sorted by task, 16-float
``obs`` and ``new_obs``, 4-float ``actions``: 150 bytes per row in memory); "1x" has
``--rows`` rows (default 131,072), "8x" eight times as many. K = Q = 10, two learners with
meta-batches of 25 tasks each, ``tasks.mode: memory`` (every worker reads the whole
training set into its own memory: the driver none of it).

1. Peak RSS of the driver process during ``train_on_ray`` (``--iterations`` meta-steps,
   default 20, on a local Ray of 2 CPUs) for the 8x dataset, divided by the same for the
   1x dataset. The peak is reset (``/proc/self/clear_refs``) after ``read_episodes``, whose
   validation is not part of this figure. Target <= 1.3.
2. Meta-batches/s of a worker's stream and learner (rank 0 of 2: ``read_task_samples`` in a
   Ray task, then ``MetaLearner.step`` on each of its meta-batches of 25 tasks) on the 1x
   dataset, divided by the same for one in-process learner (``task_samples`` read through
   Ray Data in the driver, meta-batches of 25 tasks); reads not timed; the median of
   ``--rounds`` rounds' ratios (default 3). Target >= 0.8.

    .venv/bin/python bench/scale_out.py [--rows 131072] [--iterations 20] [--rounds 3]

A few minutes on a busy 2-core machine. Each figure is written as a record
(``bench/records.py``).
"""

from __future__ import annotations

import argparse
import json
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

import torch

from bench.records import Baseline, write_record
from bench.tasks import META_BATCH, QUERY, ROW_BYTES, SUPPORT, write_dataset
from flows.process.runtime import set_quiet_environment

set_quiet_environment()
torch.set_num_threads(1)  # 2 cores: a second intra-op thread slows small meta-steps

LEARNERS = 2


def _config(directory: Path, run_dir: Path, iterations: int):
    from flows.config import validate_config

    return validate_config(
        {
            "data": {"train": str(directory), "heldout": str(directory)},
            "tasks": {
                "support": SUPPORT,
                "query": QUERY,
                "meta_batch": META_BATCH,
                "mode": "memory",
            },
            "learners": {
                "num_learners": LEARNERS,
                "modules": {
                    "default_policy": {
                        "obs_dim": 16,
                        "action_dim": 4,
                        "model": {"hidden_sizes": [40, 40]},
                    }
                },
            },
            "training": {
                "iterations": iterations,
                "log_every": iterations,
                "checkpoint_every": iterations,
                "checkpoint_dir": str(run_dir),
            },
            "artifacts": {"name": "bench", "root": str(run_dir / "artifacts")},
        }
    )


def _start_ray() -> None:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def driver_child(directory: Path, iterations: int) -> None:
    """In a fresh process: validate, reset the peak RSS, train on Ray Train; print the
    driver's peak RSS during training (bytes) and the seconds it took."""
    import ray

    from flows.scale_out import train_on_ray
    from pipeline.reads.episodes import read_episodes

    _start_ray()
    try:
        episodes = read_episodes(directory)
        with tempfile.TemporaryDirectory(prefix="offmeta-bench-run-") as run_dir:
            cfg = _config(directory, Path(run_dir), iterations)
            Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM, the peak RSS
            start = time.perf_counter()
            train_on_ray(cfg, episodes, run_dir=run_dir)
            seconds = time.perf_counter() - start
        print(json.dumps({"peak_rss": _peak_rss(), "seconds": seconds}))
    finally:
        ray.shutdown()


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmHWM line")


def driver_peak(directory: Path, iterations: int) -> dict:
    argv = [sys.executable, __file__, "--driver-child", str(directory)]
    done = subprocess.run(
        [*argv, "--iterations", str(iterations)], capture_output=True, text=True, timeout=1800
    )
    if done.returncode != 0:
        raise RuntimeError(f"the driver run failed for {directory}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _learner():
    from learners import MetaLearner

    module = {"obs_dim": 16, "action_dim": 4, "model": {"hidden_sizes": [40, 40]}}
    return MetaLearner(
        {"algorithm": "maml", "modules": {"default_policy": module}, "inner": {"lr": 0.01}}
    )


def _steps(samples, ranks: list[int] | None, learners: int, batches: int) -> float:
    """Seconds for ``batches`` meta-batches of the first stream, each a learner step."""
    from pipeline.streams.learner_stream import split_for_learners
    from pipeline.tasks.options import TaskStream

    learner = _learner()
    streams = split_for_learners(
        TaskStream(samples, ranks=ranks), learners, minibatch_size=META_BATCH, seed=0
    )
    stream = streams[0]
    with stream:
        iterator = iter(stream.take(batches + 1))
        learner.step(next(iterator))  # warm-up: first allocations
        start = time.perf_counter()
        for meta_batch in iterator:
            learner.step(meta_batch)
        return time.perf_counter() - start


def _worker_seconds(info, batches: int) -> float:
    """What a Ray Train worker of rank 0 does: read its share, step on its meta-batches."""
    import torch as worker_torch

    from pipeline.tasks.samples import read_task_samples

    worker_torch.set_num_threads(1)
    samples = read_task_samples(info, support=SUPPORT, query=QUERY, mode="memory")
    return _steps(samples, [0], LEARNERS, batches)


def throughput(directory: Path, rounds: int) -> dict:
    import ray

    from flows.scale_out.driver import without_rows
    from pipeline.reads.episodes import read_episodes
    from pipeline.tasks.samples import task_samples

    _start_ray()
    try:
        episodes = read_episodes(directory)
        samples = task_samples(episodes, support=SUPPORT, query=QUERY, mode="memory")
        batches = samples.samples_per_epoch // (META_BATCH * LEARNERS)
        on_worker = ray.remote(num_cpus=1)(_worker_seconds)
        info = without_rows(episodes)
        worker, local = [], []
        for _ in range(rounds):
            worker.append(batches / ray.get(on_worker.remote(info, batches)))
            local.append(batches / _steps(samples, None, 1, batches))
        return {
            "worker": worker,
            "local": local,
            "ratios": [w / s for w, s in zip(worker, local, strict=True)],
            "batches": batches,
        }
    finally:
        ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=131_072)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--driver-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver_child is not None:
        driver_child(args.driver_child, args.iterations)
        return

    scratch = Path(tempfile.mkdtemp(prefix="offmeta-bench-scale-out-"))
    try:
        sizes = {"1x": args.rows, "8x": 8 * args.rows}
        directories = {
            name: write_dataset(scratch / name, rows, seed=0) for name, rows in sizes.items()
        }
        peaks = {name: driver_peak(path, args.iterations) for name, path in directories.items()}
        speed = throughput(directories["1x"], args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    shape = {
        "rows_1x": sizes["1x"],
        "rows_8x": sizes["8x"],
        "row_bytes": ROW_BYTES,
        "learners": LEARNERS,
        "meta_batch": META_BATCH,
        "iterations": args.iterations,
    }
    small, large = peaks["1x"], peaks["8x"]
    ratio = large["peak_rss"] / small["peak_rss"]
    print(f"1-driver-peak-rss: 8x / 1x {ratio:.2f} (target <= 1.3)")
    for name, run in peaks.items():
        print(f"  {name}: {run['peak_rss'] / 2**20:.0f} MiB, training {run['seconds']:.1f} s")
    write_record(
        "scale_out",
        "1-driver-peak-rss",
        "peak RSS of the driver during train_on_ray (2 Ray Train workers, tasks.mode memory) "
        "on the 8x dataset",
        large["peak_rss"] / 2**20,
        "MiB",
        baseline=Baseline("the same on the 1x dataset", small["peak_rss"] / 2**20),
        target="<= 1.3",
        shape=shape,
        details={"training_seconds": {name: run["seconds"] for name, run in peaks.items()}},
    )
    median = statistics.median(speed["ratios"])
    print(f"2-worker-meta-batches-per-s: worker / in-process {median:.2f} (target >= 0.8)")
    print(
        f"  worker {statistics.median(speed['worker']):.0f}, in process "
        f"{statistics.median(speed['local']):.0f} meta-batches/s (medians of {args.rounds} "
        "rounds); per-round ratios " + ", ".join(f"{r:.2f}" for r in speed["ratios"])
    )
    write_record(
        "scale_out",
        "2-worker-meta-batches-per-s",
        "meta-batches/s of a Ray Train worker's share (rank 0 of 2, read by the worker, a "
        "MAML step each) on the 1x dataset (median of the rounds); ratio: median of the "
        "rounds' ratios",
        statistics.median(speed["worker"]),
        "meta-batches/s",
        baseline=Baseline(
            "meta-batches/s of one in-process learner on the same data",
            statistics.median(speed["local"]),
        ),
        ratio=median,
        target=">= 0.8",
        shape={**shape, "rounds": args.rounds, "batches": speed["batches"]},
        details={"worker": speed["worker"], "local": speed["local"], "ratios": speed["ratios"]},
    )


if __name__ == "__main__":
    main()
