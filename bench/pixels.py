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
   (every tensor finalize copies), in ``--rounds`` alternating rounds. Figures: rows/s uint8
   against float32 (median of per-round ratios), and float32's bytes per batch over uint8's
   (4x for the images, a little less for the whole batch).

Run: ``.venv/bin/python bench/pixels.py [--part learning|transfer|all] [--seeds 0 1 2]
[--iterations N] [--rounds R] [--no-record]``. Learning takes about 3 minutes per seed on the busy
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
from collections.abc import Callable, Mapping
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


def _config(seed: int, iterations: int | None, run_dir: Path, path: Path = CONFIG) -> Any:
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
    return load_config(path, overrides)


def learning(
    seeds: list[int], iterations: int | None, config: Path = CONFIG, *, record: bool
) -> None:
    """Part 1: train per seed, adapt on held-out support rows, roll out in the pixel env."""
    import torch

    from flows.process.runtime import ray_session
    from flows.stages.datasets import validate_datasets
    from flows.stages.train import train

    torch.set_num_threads(1)
    quiet = logging.getLogger("bench.pixels")
    quiet.setLevel(logging.WARNING)
    results, seconds = [], []
    with tempfile.TemporaryDirectory() as scratch:
        base = _config(seeds[0], iterations, Path(scratch), config)
        with ray_session(base.ray):
            datasets = validate_datasets(base)
            for seed in seeds:
                cfg = _config(seed, iterations, Path(scratch) / f"seed-{seed}", config)
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
    _report_learning(results, seconds, base, seeds, config, record=record)


def heldout_rollouts(cfg: Any, learner_state: Mapping[str, Any], heldout: Any) -> dict[str, float]:
    """Mean return and success rate of the unadapted and adapted policies, and the mean
    return of the noise-free expert, over ``evaluation.rollout_episodes`` episodes of each
    of ``evaluation.tasks`` held-out tasks. Each task's policy adapts on one support sample
    of that task (the training inner rule); every policy then acts in ``make_env``
    environments stepped in lockstep, one batch of observations per step through finalize,
    as training saw them."""
    import torch
    from torch.func import functional_call, vmap

    from learners.meta.learner import MetaLearner
    from learners.meta.meta_batch import task_slice
    from learners.models.factory import build_model
    from pipeline.streams.collate import finalize
    from pipeline.synthetic.point_robot_pixels_env import make_env
    from pipeline.tasks.samples import task_samples

    settings = cfg.evaluation
    learner = MetaLearner.from_state(learner_state, device=cfg.training.device)
    samples = task_samples(heldout, support=cfg.tasks.support, query=cfg.tasks.query)
    meta_batch, task_ids = samples.one_per_task(settings.tasks, seed=settings.seed)
    layout = heldout.schema.obs_layout
    support = finalize(meta_batch, learner.device, obs_layout=layout)["support"]
    module = learner.config.rollout_module
    adapted = [
        learner.adapt(None, task_slice(support, i), steps=settings.rollout_adapt_steps)[module]
        for i in range(len(task_ids))
    ]
    episodes = settings.rollout_episodes
    per_episode = {
        name: torch.stack([a[name] for a in adapted]).repeat_interleave(episodes, dim=0)
        for name in adapted[0]
    }
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    spec = learner.config.modules[module]
    model = build_model(spec).to(learner.device)

    def act(params: Mapping[str, Any], obs: Any) -> Any:
        # Observations as the losses hand them to the module: [B, *obs_shape].
        return functional_call(model, dict(params), (obs.reshape(-1, *spec.observation_shape),))

    one_row = vmap(lambda params, obs: act(params, obs[None])[0])
    generator = heldout.metadata["generator"]["args"]
    camera = {key: generator[key] for key in ("image_size", "blob_sigma", "layout")}
    tasks = [heldout.metadata["tasks"][task_id] for task_id in task_ids]

    goals = np.repeat(np.array([t["goal"] for t in tasks]), episodes, axis=0)

    def run(policy: Callable[[Any], Any] | None) -> tuple[float, float]:
        envs = [
            make_env(task_id, params, **camera)
            for task_id, params in zip(task_ids, tasks, strict=True)
            for _ in range(episodes)
        ]
        return _lockstep(envs, policy, goals, learner.device, layout, settings.seed)

    unadapted, success_unadapted = run(lambda obs: act(meta, obs))
    adapted_return, success_adapted = run(lambda obs: one_row(per_episode, obs))
    expert, _ = run(None)
    return {
        "adapted": adapted_return,
        "unadapted": unadapted,
        "expert": expert,
        "success_adapted": success_adapted,
        "success_unadapted": success_unadapted,
    }


def _lockstep(
    envs: list[Any],
    policy: Callable[[Any], Any] | None,
    goals: np.ndarray,
    device: Any,
    layout: str | None,
    seed: int,
) -> tuple[float, float]:
    """Mean return and success rate of one episode per env; ``policy=None`` plays the
    noise-free expert towards ``goals`` from the positions the envs report."""
    import torch

    from pipeline.streams.collate import finalize
    from pipeline.synthetic.point_robot import EPISODE_STEPS, expert_actions

    starts = [env.reset(seed=seed * 100_003 + i) for i, env in enumerate(envs)]
    obs = np.stack([o for o, _ in starts])
    positions = np.array([info["position"] for _, info in starts])
    returns = np.zeros(len(envs))
    successes = np.zeros(len(envs), dtype=bool)
    rng = np.random.default_rng(seed)
    for _ in range(EPISODE_STEPS):
        if policy is None:
            actions = expert_actions(positions, goals, rng, noise_std=0.0, random_fraction=0.0)
        else:
            images = finalize({"m": {"obs": torch.from_numpy(obs)}}, device, obs_layout=layout)
            with torch.no_grad():
                actions = policy(images["m"]["obs"]).cpu().numpy()
        steps = [env.step(action) for env, action in zip(envs, actions, strict=True)]
        obs = np.stack([s[0] for s in steps])
        returns += [s[1] for s in steps]
        positions = np.array([s[4]["position"] for s in steps])
        successes |= [bool(s[4].get("is_success", False)) for s in steps]
    return float(returns.mean()), float(successes.mean())


def _mean_and_error(values: np.ndarray) -> tuple[float, float]:
    error = float(values.std(ddof=1)) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return float(values.mean()), error


def _report_learning(
    results: list[dict[str, float]],
    seconds: list[float],
    cfg: Any,
    seeds: list[int],
    config: Path,
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
        f"Pixel point robot (1x32x32 uint8 images, {config.name}), held-out adapted return "
        "(mean of seeds); "
        "baseline: the unadapted meta-policy on the same goals and starts; ratio: the lead in "
        "standard errors of the difference of the means",
        mean_a,
        "return",
        shape={
            "data": "point_robot_pixels",
            "config": config.name,
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


def transfer(rounds: int, *, record: bool) -> None:
    """Part 2: rows/s through task streams and bytes per meta-batch, uint8 vs float32, in
    alternating rounds (the shared machine's load moves between them)."""
    import torch

    torch.set_num_threads(1)
    tasks = _config(0, None, Path("runs")).tasks
    rates: dict[str, list[float]] = {"uint8": [], "float32": []}
    with tempfile.TemporaryDirectory() as scratch:
        sources = {"uint8": SAMPLE / "train"}
        sources["float32"] = _float_copy(SAMPLE / "train", Path(scratch) / "float32")
        sizes = {name: _batch_bytes(path, tasks) for name, path in sources.items()}
        for _ in range(rounds):
            for name, path in sources.items():
                rates[name].append(_stream_rate(path, tasks))
    rows_per_batch = tasks.meta_batch * (tasks.support + tasks.query)
    median = {name: float(np.median(values)) for name, values in rates.items()}
    for name, (nbytes, images) in sizes.items():
        print(
            f"{name:8s} {median[name] / 1e3:8.1f} K image rows/s (median of {rounds}: "
            f"{', '.join(f'{r / 1e3:.1f}' for r in rates[name])})  {nbytes / 1024:8.1f} KiB "
            f"per meta-batch ({images / 1024:.1f} KiB of it images, {rows_per_batch} rows)"
        )
    per_round = [u / f for u, f in zip(rates["uint8"], rates["float32"], strict=True)]
    rate_ratio = float(np.median(per_round))
    bytes_ratio = sizes["float32"][0] / sizes["uint8"][0]
    image_ratio = sizes["float32"][1] / sizes["uint8"][1]
    print(
        f"uint8 / float32 rows/s: {rate_ratio:.2f}x (median of per-round ratios); float32 / "
        f"uint8 bytes per batch: {bytes_ratio:.2f}x (images alone {image_ratio:.2f}x)"
    )
    if not record:
        return
    shape = {
        "data": "point_robot_pixels/train",
        "image": [1, 32, 32],
        "rows_per_batch": rows_per_batch,
        "batches": TRANSFER_BATCHES,
        "rounds": rounds,
        "device": "cpu",
    }
    details = {
        "rows_per_s": rates,
        "per_round_ratio": per_round,
        "bytes_per_batch": {name: b for name, (b, _) in sizes.items()},
        "image_bytes_per_batch": {name: i for name, (_, i) in sizes.items()},
    }
    write_record(
        "pixels",
        "2-stream-rows-per-s",
        "Image rows per second through split_for_learners task streams on CPU, uint8 images "
        "(finalize converts them to float32 there); baseline: the same images stored as "
        "float32; ratio: median of per-round ratios",
        median["uint8"],
        "rows/s",
        shape=shape,
        baseline=Baseline("float32 images, rows per second (median)", median["float32"]),
        ratio=rate_ratio,
        details=details,
    )
    write_record(
        "pixels",
        "3-bytes-per-batch",
        "Bytes one meta-batch moves host to device with uint8 images; ratio: float32 "
        "images' bytes over uint8's (the saving factor)",
        sizes["uint8"][0],
        "bytes",
        shape=shape,
        baseline=Baseline("float32 images, bytes per meta-batch", sizes["float32"][0]),
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


def _task_windows(directory: Path, tasks: Any) -> Any:
    from pipeline.reads.episodes import inspect_episodes
    from pipeline.tasks.samples import task_samples

    return task_samples(
        inspect_episodes(directory),
        support=tasks.support,
        query=tasks.query,
        mode="stream",
        memory_budget_mb=256,
    )


def _batch_bytes(directory: Path, tasks: Any) -> tuple[int, int]:
    """Bytes of a meta-batch, and of its images, for one dataset."""
    return _moved_bytes(_task_windows(directory, tasks).read_window(0), tasks.meta_batch)


def _stream_rate(directory: Path, tasks: Any) -> float:
    """Rows per second of ``TRANSFER_BATCHES`` meta-batches of one dataset, on CPU."""
    from pipeline.streams.learner_stream import split_for_learners

    samples = _task_windows(directory, tasks)
    (stream,) = split_for_learners(samples, 1, minibatch_size=tasks.meta_batch, seed=0)
    with stream:
        for _ in stream.take(10):  # the first window's read, outside the timing
            pass
        start = time.perf_counter()
        for _ in stream.take(TRANSFER_BATCHES):
            pass
        elapsed = time.perf_counter() - start
    return TRANSFER_BATCHES * tasks.meta_batch * (tasks.support + tasks.query) / elapsed


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
    parser.add_argument("--rounds", type=int, default=3, help="transfer rounds per dtype")
    parser.add_argument("--config", type=Path, default=CONFIG, help="run config to learn with")
    parser.add_argument(
        "--no-record", action="store_true", help="print only (trial runs of other sizes)"
    )
    args = parser.parse_args()
    set_quiet_environment()
    if args.part in ("transfer", "all"):
        transfer(args.rounds, record=not args.no_record)
    if args.part in ("learning", "all"):
        learning(args.seeds, args.iterations, args.config, record=not args.no_record)


if __name__ == "__main__":
    main()
