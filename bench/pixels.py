"""Image observations: does the pixel point robot learn, and what do uint8 images save?

1. Learning (``--part learning``): ``flows/configs/point_robot_pixels.yaml`` trains through the
   run's own train stage (Ray reads, task samples, the meta-learner) on the committed
   ``data/samples/point_robot_pixels`` sample, once per seed. Each trained learner then adapts
   on one support sample of each held-out task (``evaluation.rollout_adapt_steps`` inner
   steps, the training rule) and rolls out ``evaluation.rollout_episodes`` episodes per task
   in the pixel environment (``pipeline.synthetic.point_robot_pixels_env.make_env``, the
   ``evaluation.env`` factory shape), unadapted and adapted alike, same starts. Figure:
   adapted return over seeds (mean ± s.e.), baseline the unadapted return; target: the
   adapted mean above the unadapted one by at least 2 standard errors of the difference.
2. Transfer (``--part transfer``): the same train split as uint8 images and as float32
   (``obs / 255``, written beside it), streamed as meta-batches through
   ``split_for_learners`` in this one run: image rows per second (finalize's conversion
   included for uint8) and the bytes of one meta-batch that cross from host to device
   (every tensor finalize copies). Figures: rows/s uint8 against float32, and float32's
   bytes per batch over uint8's (4x expected for the images, less for the whole batch).

Run: ``.venv/bin/python bench/pixels.py [--part learning|transfer|all] [--seeds 0 1 2]
[--iterations N] [--no-record]``. Learning takes about 3 minutes per seed on the busy
2-core development machine; transfer under a minute.
"""

from __future__ import annotations

import argparse
import json
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
CONFIG = ROOT / "flows" / "configs" / "point_robot_pixels.yaml"
SAMPLE = ROOT / "data" / "samples" / "point_robot_pixels"
TRANSFER_BATCHES = 200


def _config(seed: int, iterations: int | None, run_dir: Path) -> Any:
    from flows.config import load_config

    overrides = [
        f"training.seed={seed}",
        f"training.checkpoint_dir={run_dir}",
        f"tasks.seed={seed}",
        f"learners.seed={seed}",
    ]
    if iterations is not None:
        overrides += [
            f"training.iterations={iterations}",
            f"training.checkpoint_every={iterations}",
            f"training.log_every={iterations}",
        ]
    return load_config(CONFIG, overrides)


def learning(seeds: list[int], iterations: int | None, *, record: bool) -> None:
    """Part 1: train per seed, adapt on held-out support rows, roll out in the pixel env."""
    import torch

    from bench.pixel_rollouts import heldout_rollouts
    from flows.process.runtime import ray_session
    from flows.stages.datasets import validate_datasets
    from flows.stages.train import train

    torch.set_num_threads(1)
    quiet = logging.getLogger("bench.pixels")
    quiet.setLevel(logging.WARNING)
    results, seconds = [], []
    with tempfile.TemporaryDirectory() as scratch:
        base = _config(seeds[0], iterations, Path(scratch))
        with ray_session(base.ray):
            datasets = validate_datasets(base)
            for seed in seeds:
                cfg = _config(seed, iterations, Path(scratch) / f"seed-{seed}")
                start = time.perf_counter()
                trained = train(cfg, datasets.train, run_dir=Path(scratch) / f"seed-{seed}")
                returns = heldout_rollouts(cfg, trained.learner_state, datasets.heldout)
                seconds.append(time.perf_counter() - start)
                results.append(returns)
                print(
                    f"seed {seed}: adapted {returns['adapted']:8.3f}  unadapted "
                    f"{returns['unadapted']:8.3f}  expert {returns['expert']:8.3f}  success "
                    f"{returns['success_adapted']:.2f} vs {returns['success_unadapted']:.2f}  "
                    f"({seconds[-1]:.0f} s)",
                    flush=True,
                )
    _report_learning(results, seconds, base, seeds, record=record)


def _mean_and_error(values: np.ndarray) -> tuple[float, float]:
    error = float(values.std(ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return float(values.mean()), error


def _report_learning(
    results: list[dict[str, float]],
    seconds: list[float],
    cfg: Any,
    seeds: list[int],
    *,
    record: bool,
) -> None:
    adapted = np.array([r["adapted"] for r in results])
    unadapted = np.array([r["unadapted"] for r in results])
    (mean_a, se_a), (mean_u, se_u) = _mean_and_error(adapted), _mean_and_error(unadapted)
    joint = math.hypot(se_a, se_u)
    lead = (mean_a - mean_u) / joint if joint > 0 else math.inf
    expert = float(np.mean([r["expert"] for r in results]))
    iterations = cfg.training.iterations
    print(f"\nheld-out return over seeds {seeds}, {iterations} meta-iterations each")
    print(f"  adapted   {mean_a:8.3f} ± {se_a:.3f} (s.e.)")
    print(f"  unadapted {mean_u:8.3f} ± {se_u:.3f} (s.e.)")
    print(f"  expert    {expert:8.3f}   (noise-free, same goals and starts)")
    print(f"adapted - unadapted = {mean_a - mean_u:+.3f} = {lead:.1f} standard errors (>= 2)")
    if not record:
        return
    tasks, evaluation = cfg.tasks, cfg.evaluation
    write_record(
        "pixels",
        "1-adapted-return",
        "Pixel point robot (1x32x32 uint8 images), held-out adapted return (mean of seeds); "
        "baseline: the unadapted meta-policy on the same goals and starts; ratio: the lead in "
        "standard errors of the difference of the means",
        mean_a,
        "return",
        shape={
            "data": "point_robot_pixels",
            "iterations": iterations,
            "seeds": len(seeds),
            "support": tasks.support,
            "query": tasks.query,
            "meta_batch": tasks.meta_batch,
            "heldout_tasks": evaluation.tasks,
            "rollout_episodes": evaluation.rollout_episodes,
        },
        baseline=Baseline("unadapted meta-policy, held-out return (mean of seeds)", mean_u),
        ratio=lead,
        target=">= 2",
        details={
            "seeds": seeds,
            "adapted": adapted.tolist(),
            "unadapted": unadapted.tolist(),
            "adapted_se": se_a,
            "unadapted_se": se_u,
            "expert": expert,
            "success_adapted": [r["success_adapted"] for r in results],
            "success_unadapted": [r["success_unadapted"] for r in results],
            "seconds_per_run": [round(s, 1) for s in seconds],
        },
    )


def transfer(*, record: bool) -> None:
    """Part 2: rows/s through task streams and bytes per meta-batch, uint8 vs float32."""
    import torch

    torch.set_num_threads(1)
    cfg = _config(0, None, Path("runs"))
    tasks = cfg.tasks
    with tempfile.TemporaryDirectory() as scratch:
        floats = _float_copy(SAMPLE / "train", Path(scratch) / "float32")
        measured = {
            "uint8": _stream_rate(SAMPLE / "train", tasks),
            "float32": _stream_rate(floats, tasks),
        }
    rows_per_batch = tasks.meta_batch * (tasks.support + tasks.query)
    for name, (rate, nbytes, images) in measured.items():
        print(
            f"{name:8s} {rate / 1e3:8.1f} K image rows/s  {nbytes / 1024:8.1f} KiB per meta-batch "
            f"({images / 1024:.1f} KiB of it images, {rows_per_batch} rows)"
        )
    rate_ratio = measured["uint8"][0] / measured["float32"][0]
    bytes_ratio = measured["float32"][1] / measured["uint8"][1]
    image_ratio = measured["float32"][2] / measured["uint8"][2]
    print(
        f"uint8 / float32 rows/s: {rate_ratio:.2f}x; float32 / uint8 bytes per batch: "
        f"{bytes_ratio:.2f}x (images alone {image_ratio:.2f}x)"
    )
    if not record:
        return
    shape = {
        "data": "point_robot_pixels/train",
        "image": [1, 32, 32],
        "rows_per_batch": rows_per_batch,
        "batches": TRANSFER_BATCHES,
        "device": "cpu",
    }
    details = {
        name: {"rows_per_s": r, "bytes_per_batch": b, "image_bytes": i}
        for name, (r, b, i) in measured.items()
    }
    write_record(
        "pixels",
        "2-stream-rows-per-s",
        "Image rows per second through split_for_learners task streams, uint8 images "
        "(converted to float32 by finalize); baseline: the same images stored as float32",
        measured["uint8"][0],
        "rows/s",
        shape=shape,
        baseline=Baseline("float32 images, rows per second", measured["float32"][0]),
        details=details,
    )
    write_record(
        "pixels",
        "3-bytes-per-batch",
        "Bytes one meta-batch moves host to device with uint8 images; ratio: float32 "
        "images' bytes over uint8's (the saving factor)",
        measured["uint8"][1],
        "bytes",
        shape=shape,
        baseline=Baseline("float32 images, bytes per meta-batch", measured["float32"][1]),
        ratio=bytes_ratio,
        target=">= 3",
        details=details,
    )


def _float_copy(source: Path, out: Path) -> Path:
    """``source`` with its images as float32 ``obs / 255``: the same rows, 4x the bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out.mkdir(parents=True)
    for path in sorted(source.glob("*.parquet")):
        table = pq.read_table(path)
        for name in ("obs", "new_obs")[: 1 + ("new_obs" in table.column_names)]:
            images = table.column(name).combine_chunks().to_numpy_ndarray()
            scaled = np.ascontiguousarray(images, dtype=np.float32) / np.float32(255)
            column = pa.FixedShapeTensorArray.from_numpy_ndarray(scaled)
            table = table.set_column(table.schema.get_field_index(name), name, column)
        pq.write_table(table, out / path.name, compression="zstd")
    document = json.loads((source / "dataset.json").read_text())
    document.pop("observation_layout", None)
    document["observation_space"] = {"kind": "box", "shape": document["observation_space"]["shape"]}
    (out / "dataset.json").write_text(json.dumps(document))
    return out


def _stream_rate(directory: Path, tasks: Any) -> tuple[float, int, int]:
    """``(rows/s, bytes per meta-batch, image bytes of it)`` for one dataset."""
    from pipeline.reads.episodes import inspect_episodes
    from pipeline.streams.learner_stream import split_for_learners
    from pipeline.tasks.samples import task_samples

    samples = task_samples(
        inspect_episodes(directory),
        support=tasks.support,
        query=tasks.query,
        mode="stream",
        memory_budget_mb=256,
    )
    total, images = _moved_bytes(samples.read_window(0), tasks.meta_batch)
    (stream,) = split_for_learners(samples, 1, minibatch_size=tasks.meta_batch, seed=0)
    with stream:
        for _ in stream.take(10):  # the first window's read, outside the timing
            pass
        start = time.perf_counter()
        for _ in stream.take(TRANSFER_BATCHES):
            pass
        elapsed = time.perf_counter() - start
    rows = TRANSFER_BATCHES * tasks.meta_batch * (tasks.support + tasks.query)
    return rows / elapsed, total, images


def _moved_bytes(samples: Any, tasks_per_batch: int) -> tuple[int, int]:
    """Bytes of every tensor, and of the image tensors, in a meta-batch of the samples'
    columns: what finalize copies to the device."""
    from pipeline.streams.collate import IMAGE_COLUMNS

    rows = tasks_per_batch * (samples.support + samples.query)
    total = images = 0
    for name, array in samples.arrays.items():
        nbytes = rows * array[0].nbytes
        total += nbytes
        images += nbytes if name in IMAGE_COLUMNS else 0
    return total, images


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("learning", "transfer", "all"), default="all")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="meta-iterations per run")
    parser.add_argument(
        "--no-record", action="store_true", help="print only (trial runs of other sizes)"
    )
    args = parser.parse_args()
    set_quiet_environment()
    if args.part in ("transfer", "all"):
        transfer(record=not args.no_record)
    if args.part in ("learning", "all"):
        learning(args.seeds, args.iterations, record=not args.no_record)


if __name__ == "__main__":
    main()
