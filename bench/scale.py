"""Scale-out benchmark: meta-iterations/s with 1 and 2 Ray Train learners, and rows/s per
learner, against one learner in this process, all measured in this run.

MAML on the shipped sinusoid sample (K = Q = 10, 25 tasks per learner and meta-step, so 2
learners train on 50 tasks per step: weak scaling). Each setup trains twice, ``SHORT`` and
``SHORT + EXTRA`` iterations; the rate is ``EXTRA`` over the difference of the two wall
times, so start-up (Ray Train's worker group, reading the samples) drops out and what is
left is the cost of one more meta-step: compute, the all-reduce, the share of checkpoints.

Report only. On a 2-core machine two learners share the cores that one learner already
uses, so the 2-learner/1-learner ratio shows the cost of synchronising, not a speed-up.

Run: ``.venv/bin/python bench/scale.py [--extra N]``. Each figure is written as a record
(``bench/records.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import Baseline, write_record
from flows.process.runtime import set_quiet_environment

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "samples" / "sinusoid"
SHORT = 50
SUPPORT = QUERY = 10
TASKS_PER_LEARNER = 25


def _config(run_dir: Path, learners: int, iterations: int):
    from flows.config import validate_config

    return validate_config(
        {
            "data": {"train": str(SAMPLE / "train"), "heldout": str(SAMPLE / "heldout")},
            "tasks": {"support": SUPPORT, "query": QUERY, "meta_batch": TASKS_PER_LEARNER},
            "learners": {"num_learners": learners},
            "training": {
                "iterations": iterations,
                "log_every": 250,
                "checkpoint_every": 500,
                "checkpoint_dir": str(run_dir),
            },
            "artifacts": {"name": "bench-scale", "root": str(run_dir / "artifacts")},
        }
    )


def _seconds(data, root: Path, learners: int, iterations: int) -> float:
    from flows.scale_out import train_on_ray
    from flows.stages.train import train

    run_dir = root / f"learners-{learners}-iterations-{iterations}"
    cfg = _config(run_dir, learners, iterations)
    stage = train if learners == 0 else train_on_ray
    start = time.perf_counter()
    stage(cfg, data, run_dir=run_dir)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", type=int, default=1000, help="iterations timed (default 1000)")
    args = parser.parse_args()
    set_quiet_environment()
    logging.basicConfig(level=logging.WARNING)
    import ray
    import torch

    from pipeline.reads.episodes import read_episodes

    # Each Ray Train worker computes with one thread (its CPU share is below 2); the
    # in-process learner does the same, so the rows compare like with like. (With two
    # threads on a busy 2-core machine a step of this tiny MLP can take 20x longer.)
    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = context.print_on_execution_start = False
        data = read_episodes(SAMPLE / "train")
        rows: list[tuple[str, int, float, float]] = []
        with tempfile.TemporaryDirectory(prefix="offmeta-bench-scale-") as tmp:
            # Untimed: the first training in a process pays one-time costs (imports, first
            # kernels) that would otherwise land on the in-process short run alone and make
            # its difference meaningless (measured: a negative rate).
            _seconds(data, Path(tmp) / "warm-up", 0, SHORT)
            for label, learners in (("in process", 0), ("Ray Train", 1), ("Ray Train", 2)):
                short = _seconds(data, Path(tmp), learners, SHORT)
                long = _seconds(data, Path(tmp), learners, SHORT + args.extra)
                if long <= short:
                    raise RuntimeError(
                        f"{label}, {learners} learners: {SHORT + args.extra} iterations took "
                        f"{long:.1f} s, no longer than {SHORT} ({short:.1f} s); the machine "
                        "was too busy to measure a rate: rerun, or raise --extra"
                    )
                rows.append((label, learners, args.extra / (long - short), short))
    finally:
        ray.shutdown()
    _print(rows, args.extra)
    _write(rows, args.extra)


def _print(rows: list[tuple[str, int, float, float]], extra: int) -> None:
    baseline = rows[1][2]  # Ray Train, 1 learner
    rows_per_step = TASKS_PER_LEARNER * (SUPPORT + QUERY)
    print(
        f"\nMAML sinusoid, K=Q={SUPPORT}, {TASKS_PER_LEARNER} tasks per learner and step; "
        f"rate over {extra} extra iterations\n"
    )
    header = (
        f"{'setup':<12} {'learners':>8} {'tasks/step':>10} {'it/s':>8} "
        f"{'x 1 learner':>11} {'rows/s/learner':>15} {'start-up s':>10}"
    )
    print(header)
    print("-" * len(header))
    for label, learners, rate, short in rows:
        print(
            f"{label:<12} {max(learners, 1):>8} {TASKS_PER_LEARNER * max(learners, 1):>10} "
            f"{rate:>8.1f} {rate / baseline:>10.2f}x {rate * rows_per_step:>15,.0f} "
            f"{short - SHORT / rate:>10.1f}"
        )
    print(
        "\nx 1 learner: meta-iterations/s against Ray Train with 1 learner. start-up s: wall "
        f"time of the {SHORT}-iteration run less its iterations (reading, workers, process "
        f"group). Machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the "
        "end (other processes slow the 2-learner all-reduce most: both workers must run)."
    )


def _write(rows: list[tuple[str, int, float, float]], extra: int) -> None:
    (_, _, in_process, _), (_, _, one, _), (_, _, two, _) = rows
    shape = {
        "extra_iterations": extra,
        "tasks_per_learner": TASKS_PER_LEARNER,
        "support": SUPPORT,
        "query": QUERY,
    }
    startup = {f"{label} {max(n, 1)}": short - SHORT / rate for label, n, rate, short in rows}
    baseline = Baseline("Ray Train, 1 learner, meta-iterations/s", one)
    for figure, description, rate in (
        ("1-two-learners", "Ray Train, 2 learners (weak scaling), meta-iterations/s", two),
        ("2-in-process", "one learner in this process, meta-iterations/s", in_process),
    ):
        write_record(
            "scale",
            figure,
            description,
            rate,
            "it/s",
            baseline=baseline,
            shape=shape,
            details={"startup_s": startup},
        )


if __name__ == "__main__":
    main()
