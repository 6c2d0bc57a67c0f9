"""Offline meta-RL benchmark: MACAW against MAML behaviour cloning on mixed-quality data.

Both train on the committed mixed point-robot sample (per task, half the episodes from a
uniform random policy, half from the noisy expert), with the same task samples (K support,
Q query, M tasks per meta-batch, seeded alike), the same number of meta-iterations, the
same network size, and 3 seeds each. Both are then evaluated exactly alike on the 40
held-out goals: each policy adapts on one support sample of each task with its training
inner rule (1 step), and rolls out 10 episodes per goal in the point-robot environment.

- MACAW: `flows/configs/point_robot_macaw.yaml` as shipped.
- Cloning: the same file with `algorithm: maml`, one deterministic policy of the same
  width trained with `mse`, inner SGD at 0.5 and outer Adam at 1e-3 (the settings of
  `flows/configs/point_robot.yaml`, the cloning run of `make run`).

Printed: held-out adapted return, mean ± std over seeds, for both; the noise-free expert's
return and the behaviour data's mean return (the same for every seed). Figures (records):

1. gap closed: (MACAW - cloning) / (expert - cloning), target >= 0.5;
2. MACAW's lead over cloning in standard errors of the difference of the means, target >= 2.

Run: `.venv/bin/python bench/offline_rl.py [--iterations N] [--seeds 0 1 2] [--no-record]`.
About 6-8 minutes on the busy 2-core development machine with the defaults.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import Baseline, write_record
from flows.process.runtime import set_quiet_environment

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "flows" / "configs" / "point_robot_macaw.yaml"
CLONING = {
    "learners.algorithm": "maml",
    "learners.modules": {
        "default_policy": {
            "obs_dim": 2,
            "action_dim": 2,
            "model": {"hidden_sizes": [100, 100, 100], "activation": "relu"},
            "loss": "mse",
        }
    },
    "learners.inner": {"lr": 0.5, "steps": 1},
    "learners.outer": {"lr": 1e-3},
}


def _config(algorithm: str, seed: int, iterations: int, run_dir: Path) -> Any:
    from flows.config import load_config

    overrides = [
        f"training.iterations={iterations}",
        f"training.checkpoint_every={iterations}",
        f"training.log_every={iterations}",
        f"training.seed={seed}",
        f"training.checkpoint_dir={run_dir}",
        f"tasks.seed={seed}",
        f"learners.seed={seed}",
    ]
    cfg = load_config(CONFIG, overrides)
    if algorithm == "macaw":
        return cfg
    document = cfg.model_dump(mode="json")
    learners = document["learners"]
    learners.pop("macaw")
    for key, value in CLONING.items():
        learners[key.removeprefix("learners.")] = value
    from flows.config import validate_config

    return validate_config(document)


def _train_and_evaluate(cfg: Any, datasets: Any, run_dir: Path) -> dict[str, float]:
    from flows.evaluation.heldout import evaluate
    from flows.stages.train import train

    quiet = logging.getLogger("offline_rl")
    quiet.setLevel(logging.WARNING)
    trained = train(cfg, datasets.train, run_dir=run_dir, logger=quiet)
    report = evaluate(cfg, trained.learner_state, datasets.heldout, logger=quiet)
    assert report.returns is not None  # point_robot has rollouts
    return dict(report.returns)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=None, help="meta-iterations per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--no-record", action="store_true", help="print only (trial runs of other sizes)"
    )
    args = parser.parse_args()
    set_quiet_environment()
    import torch

    from flows.process.runtime import ray_session
    from flows.stages.datasets import validate_datasets

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        base = _config("macaw", 0, args.iterations or 1, Path(scratch))
        iterations = args.iterations or 2000
        results: dict[str, list[dict[str, float]]] = {"cloning": [], "macaw": []}
        seconds: dict[str, list[float]] = {"cloning": [], "macaw": []}
        with ray_session(base.ray):
            datasets = validate_datasets(base)
            for seed in args.seeds:
                for algorithm in results:
                    run_dir = Path(scratch) / f"{algorithm}-{seed}"
                    cfg = _config(algorithm, seed, iterations, run_dir)
                    start = time.perf_counter()
                    returns = _train_and_evaluate(cfg, datasets, run_dir)
                    seconds[algorithm].append(time.perf_counter() - start)
                    results[algorithm].append(returns)
                    print(
                        f"seed {seed} {algorithm:8s} adapted {returns['adapted']:8.3f}  "
                        f"unadapted {returns['unadapted']:8.3f}  "
                        f"({seconds[algorithm][-1]:.0f} s)",
                        flush=True,
                    )
    _report(results, seconds, base, iterations, args.seeds, record=not args.no_record)


def _report(
    results: dict[str, list[dict[str, float]]],
    seconds: dict[str, list[float]],
    cfg: Any,
    iterations: int,
    seeds: list[int],
    *,
    record: bool,
) -> None:
    adapted = {name: np.array([r["adapted"] for r in runs]) for name, runs in results.items()}
    mean = {name: float(v.mean()) for name, v in adapted.items()}
    std = {name: float(v.std(ddof=1)) if len(v) > 1 else 0.0 for name, v in adapted.items()}
    error = {name: std[name] / math.sqrt(len(adapted[name])) for name in adapted}
    expert = float(results["macaw"][0]["expert"])
    behavior = float(results["macaw"][0]["behavior"])
    lead = mean["macaw"] - mean["cloning"]
    joint_error = math.hypot(error["macaw"], error["cloning"])
    in_errors = lead / joint_error if joint_error > 0 else math.inf
    gap_closed = lead / (expert - mean["cloning"])
    print(f"\nheld-out adapted return over seeds {seeds}, {iterations} meta-iterations each")
    for name in ("cloning", "macaw"):
        print(f"  {name:8s} {mean[name]:8.3f} ± {std[name]:.3f} (std; se {error[name]:.3f})")
    print(f"  expert   {expert:8.3f}   (noise-free, same goals and starts)")
    print(f"  behavior {behavior:8.3f}   (mean episode return of the held-out data)")
    print(
        f"MACAW - cloning = {lead:+.3f} = {in_errors:.2f} standard errors (target >= 2); "
        f"gap to the expert closed: {gap_closed:.2f} (target >= 0.5)"
    )
    if not record:
        return
    tasks = cfg.tasks
    shape = {
        "data": "point_robot_mixed",
        "iterations": iterations,
        "seeds": len(seeds),
        "support": tasks.support,
        "query": tasks.query,
        "meta_batch": tasks.meta_batch,
    }
    details = {
        "seeds": seeds,
        "adapted": {name: v.tolist() for name, v in adapted.items()},
        "unadapted": {n: [r["unadapted"] for r in runs] for n, runs in results.items()},
        "std": std,
        "expert": expert,
        "behavior": behavior,
        "seconds_per_run": {n: [round(s, 1) for s in v] for n, v in seconds.items()},
    }
    baseline = Baseline("MAML behaviour cloning, held-out adapted return (mean)", mean["cloning"])
    write_record(
        "offline_rl",
        "1-gap-closed",
        "MACAW held-out adapted return (mean of seeds); ratio: share of the cloning-to-expert "
        "gap it closes, (MACAW - cloning) / (expert - cloning)",
        mean["macaw"],
        "return",
        shape=shape,
        baseline=baseline,
        ratio=gap_closed,
        target=">= 0.5",
        details=details,
    )
    write_record(
        "offline_rl",
        "2-standard-errors",
        "MACAW held-out adapted return (mean of seeds); ratio: its lead over cloning in "
        "standard errors of the difference of the means",
        mean["macaw"],
        "return",
        shape=shape,
        baseline=baseline,
        ratio=in_errors,
        target=">= 2",
        details=details,
    )


if __name__ == "__main__":
    main()
