"""What the vectorized self-check (`learners.check_vectorized: first`) costs a run.

For the point-robot and sinusoid run configs: the learner the config builds, meta-batches of
the config's shape (tasks.meta_batch tasks of tasks.support + tasks.query rows, random values:
the cost depends on the shapes only), one warm-up step, then the check on a fresh meta-batch
(its seconds, the median of `--rounds`) against the training the config asks for,
`training.iterations` meta-steps through `run_meta_training` without checkpoints, timed in
the same process (with `--steps N`, N of them timed and scaled to `training.iterations`).
Prints and records (bench/results/) the check's seconds with that training time as the
baseline.

    .venv/bin/python -m bench.vectorized_check [--rounds 3] [--steps N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from bench.records import Baseline, write_record
from flows.config import load_config
from learners import MetaLearner
from learners.meta.vectorized_check import check_vectorized_gradients
from learners.training.loop import run_meta_training

CONFIGS = Path(__file__).resolve().parents[1] / "flows" / "configs"


def _meta_batch(cfg, generator: torch.Generator) -> dict:
    tasks, meta = cfg.tasks, cfg.learners.meta_config()
    module_id = meta.data_modules[0]
    spec = meta.modules[module_id]
    rows = tasks.support + tasks.query
    obs = torch.rand(tasks.meta_batch, rows, spec.obs_dim, generator=generator) * 2 - 1
    actions = torch.randn(tasks.meta_batch, rows, spec.action_dim, generator=generator)
    return {
        part: {module_id: {"obs": obs[:, cut], "actions": actions[:, cut]}}
        for part, cut in (
            ("support", slice(0, tasks.support)),
            ("query", slice(tasks.support, rows)),
        )
    }


def measure(name: str, rounds: int, steps: int | None) -> None:
    cfg = load_config(CONFIGS / f"{name}.yaml", [])
    generator = torch.Generator().manual_seed(0)
    learner = MetaLearner(cfg.learners.meta_config())
    learner.step(_meta_batch(cfg, generator))  # warm-up: the first vmapped call's set-up
    checks = []
    for _ in range(rounds):
        batch = _meta_batch(cfg, generator)
        began = time.perf_counter()
        check_vectorized_gradients(learner, batch)
        checks.append(time.perf_counter() - began)
    iterations = cfg.training.iterations if steps is None else steps
    batches = [_meta_batch(cfg, generator) for _ in range(16)]
    began = time.perf_counter()
    run_meta_training(
        learner,
        (batches[i % len(batches)] for i in range(iterations)),
        start=0,
        stop=iterations,
        log_every=cfg.training.log_every,
        checkpoint_every=iterations,
    )
    training = time.perf_counter() - began
    check = statistics.median(checks)
    run_training = training * cfg.training.iterations / iterations
    print(
        f"{name}: check {check:.3f} s (rounds {min(checks):.3f}-{max(checks):.3f}), "
        f"{iterations} meta-steps {training:.1f} s, so the config's "
        f"{cfg.training.iterations} about {run_training:.0f} s: the check is "
        f"{check / run_training:.2%} of that training"
    )
    write_record(
        "vectorized_check",
        f"check-over-training-{name.replace('_', '-')}",
        f"learners.check_vectorized on the {name} config: the self-check (vmapped against "
        "looped meta-gradients of 2 tasks, median of rounds) against the config's "
        "training.iterations meta-steps (timed, or scaled from --steps), same process",
        check,
        "s",
        baseline=Baseline(
            f"{cfg.training.iterations} meta-steps of run_meta_training", run_training
        ),
        shape={
            "tasks": cfg.tasks.meta_batch,
            "support": cfg.tasks.support,
            "query": cfg.tasks.query,
            "iterations": cfg.training.iterations,
        },
        details={
            "check_seconds": checks,
            "steps_timed": iterations,
            "steps_seconds": training,
            "torch_threads": torch.get_num_threads(),
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--steps",
        type=int,
        help="time this many meta-steps and scale to training.iterations (default: all of them)",
    )
    args = parser.parse_args()
    for name in ("point_robot", "sinusoid"):
        measure(name, args.rounds, args.steps)


if __name__ == "__main__":
    main()
