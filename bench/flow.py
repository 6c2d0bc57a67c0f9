"""The flow's training loop against the learner alone on the same meta-batches, same run.

`flows.stages.train.train` on the sinusoid config (the shipped sample, 25 tasks x K = Q = 10,
1-40-40-1, checkpoints every 500 iterations, a progress line every 200) reports its own
iterations/s; the baseline is a fresh `MetaLearner` stepping through the same first N
meta-batches, taken beforehand from a stream built the same way. Rounds alternate the two
so that both see the same load; the ratio is the median of the rounds' ratios. Target:
flow >= 0.9x the learner alone.

Run: ``.venv/bin/python bench/flow.py [--iterations N] [--rounds R] [--prefetch P]``
(``--prefetch`` overrides ``training.prefetch``). Each figure is written as a record
(``bench/records.py``).
"""

from __future__ import annotations

import argparse
import logging
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import Baseline, write_record
from flows.process.runtime import set_quiet_environment

ROOT = Path(__file__).resolve().parents[1]
_RATE = re.compile(r"\| ([0-9.]+) it/s \|")


def _config(run_dir: Path, iterations: int, prefetch: int | None):
    from flows.config import load_config

    overrides = [
        f"data.train={ROOT / 'data/samples/sinusoid/train'}",
        f"data.heldout={ROOT / 'data/samples/sinusoid/heldout'}",
        f"training.iterations={iterations}",
        f"training.checkpoint_dir={run_dir}",
    ]
    if prefetch is not None:
        overrides.append(f"training.prefetch={prefetch}")
    return load_config(ROOT / "flows" / "configs" / "sinusoid.yaml", overrides)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _flow_rate(cfg, data, run_dir: Path) -> float:
    """Iterations/s of the flow's training loop, as its own last progress line reports."""
    from flows.stages.train import train

    logger = logging.getLogger("bench.flow.train")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    lines = _Lines()
    logger.addHandler(lines)
    try:
        train(cfg, data, run_dir=run_dir, logger=logger)
    finally:
        logger.removeHandler(lines)
    last = [line for line in lines.lines if line.startswith("iteration ")][-1]
    return float(_RATE.search(last).group(1))


def _alone_rate(cfg, batches: list) -> float:
    from learners import MetaLearner

    learner = MetaLearner(cfg.learners.meta_config(), device=cfg.training.device)
    started = time.perf_counter()
    for batch in batches:
        learner.step(batch)
    learner.check_finite()
    return len(batches) / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=1000, help="meta-steps per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch", type=int, default=None, help="training.prefetch")
    args = parser.parse_args(argv)
    set_quiet_environment()
    import ray
    import torch

    from flows.stages.train import build_task_samples
    from pipeline.reads.episodes import read_episodes
    from pipeline.streams.learner_stream import split_for_learners

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    quiet = logging.getLogger("bench.flow.quiet")
    quiet.propagate = False
    try:
        with tempfile.TemporaryDirectory() as tmp:
            probe = _config(Path(tmp), args.iterations, args.prefetch)
            prefetch = probe.training.prefetch
            data = read_episodes(probe.data.train)
            samples = build_task_samples(probe, data, quiet)
            tasks = probe.tasks
            (stream,) = split_for_learners(samples, 1, minibatch_size=tasks.meta_batch, seed=0)
            with stream:
                batches = list(stream.take(args.iterations))
            flow, alone = [], []
            for index in range(args.rounds):
                cfg = _config(Path(tmp) / f"round-{index}", args.iterations, prefetch)
                alone.append(_alone_rate(cfg, batches))
                flow.append(_flow_rate(cfg, data, Path(tmp) / f"round-{index}"))
                print(
                    f"   round {index + 1}: flow {flow[-1]:.1f} it/s, learner alone "
                    f"{alone[-1]:.1f} it/s, ratio {flow[-1] / alone[-1]:.3f}",
                    flush=True,
                )
    finally:
        ray.shutdown()
    ratios = [f / a for f, a in zip(flow, alone, strict=True)]
    ratio = statistics.median(ratios)
    print(f"flow loop / learner alone: {ratio:.3f} (median of {args.rounds}; target >= 0.9)")
    write_record(
        "flow",
        "1-sinusoid-loop",
        "flows.stages.train.train, its own progress it/s (median of the rounds); ratio: median of "
        "the rounds' ratios",
        statistics.median(flow),
        "it/s",
        baseline=Baseline(
            "MetaLearner.step alone on the same meta-batches, it/s", statistics.median(alone)
        ),
        ratio=ratio,
        target=">= 0.9",
        shape={
            "iterations": args.iterations,
            "rounds": args.rounds,
            "tasks": tasks.meta_batch,
            "support": tasks.support,
            "query": tasks.query,
            "prefetch": prefetch,
        },
        details={"flow_it_s": flow, "alone_it_s": alone, "ratios": ratios},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
