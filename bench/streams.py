"""LearnerStream throughput and memory, each against a baseline measured in the same run.

Data: 16-float ``obs``, int64 ``actions``, two modules, written to a temporary directory
as 10 Parquet files of ``--rows / 10`` rows (deleted afterwards), episodes of 1,000 steps
of one module each. Minibatches of 512
rows, two learners in threads. Ray is started (and its workers warmed) before timing, with
the environment ``offmeta run`` gives it (``flows.process.runtime.QUIET_ENVIRONMENT``).

1. First epoch from disk, ``--rows`` rows (default 5M): LearnerStream rows/s divided by
   pyarrow reading the same files, grouping rows per module once and slicing zero-copy
   512-row torch minibatches (the practical limit; read time included for both). Each
   round streams a fresh epoch from the files, then runs pyarrow; the figure is the
   median of ``--rounds`` rounds' ratios (default 3). Target >= 0.7.
2. Steady epochs, ``--steady-rows`` rows (default 1M), both on the same materialized
   dataset: LearnerStream rows/s divided by the reference approach, one persistent
   ``iter_torch_batches(batch_size=512)`` per ``streaming_split`` split (RLlib's
   ``MiniBatchRayDataIterator``), each 512-row batch grouped per module like ours
   (module ids as integer codes, prepared outside the timing). Target >= 10.
2b. The same steady epochs against RLlib's own per-learner iterator,
   ``ray.rllib.utils.minibatch_utils.MiniBatchRayDataIterator``, over
   ``streaming_split(2, equal=True)`` of the materialized dataset, as RLlib's learners
   build it (see ``rllib_steady``). Target >= 15. RLlib is never a dependency of offmeta:
   this figure runs in a throwaway virtualenv outside the repository and is skipped, with
   a message, wherever ``ray.rllib`` cannot be imported (it needs gymnasium, dm_tree, ...)::

       python3.11 -m venv /tmp/offmeta-rllib-bench
       /tmp/offmeta-rllib-bench/bin/pip install torch==2.13.0  # exactly: no CUDA build
       /tmp/offmeta-rllib-bench/bin/pip install 'ray[rllib]==2.60.0' -e .
       /tmp/offmeta-rllib-bench/bin/python bench/streams.py --quick
3. Peak RSS of a process streaming one epoch (2 learners, not materialized, no cache:
   the window bound that data over ``cache_budget_mb`` gets) of all
   ``--rows`` rows divided by the same for one file (``--rows / 10``). Target <= 1.5.

    .venv/bin/python bench/streams.py [--rows 5000000] [--steady-rows 1000000] [--rounds 3]
        [--figures 1,2,2b,3]

Smaller runs for a quick look: ``--quick``, the same as ``--rows 500000 --steady-rows
200000`` (a few minutes on a busy 2-core machine). Each figure is written as a record
(``bench/records.py``) whose shape names the rows, so quick runs form their own ranges.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
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

# The environment `offmeta run` gives Ray, set before Ray starts (here and in the peak-RSS
# children; this module imports Ray only inside functions).
set_quiet_environment()

MINIBATCH = 512
LEARNERS = 2
FILES = 10
COLUMNS = ("obs", "actions", "rewards", "terminateds", "truncateds")
MODULES = ("policy_a", "policy_b")


def write_dataset(root: Path, rows: int) -> list[Path]:
    """``FILES`` files of ``rows // FILES`` transitions each, episodes of 1000 steps."""
    per_file = rows // FILES
    rng = np.random.default_rng(0)
    modules = pa.array(MODULES)
    paths = []
    for index in range(FILES):
        ids = np.arange(index * per_file, (index + 1) * per_file)
        table = pa.table(
            {
                "eps_id": pa.array(ids // 1000, pa.int64()),
                "t": pa.array(ids % 1000, pa.int32()),
                "obs": pa.FixedShapeTensorArray.from_numpy_ndarray(
                    rng.standard_normal((per_file, 16), dtype=np.float32)
                ),
                "actions": pa.array(rng.integers(0, 4, per_file), pa.int64()),
                "rewards": pa.array(rng.standard_normal(per_file, dtype=np.float32)),
                "terminateds": pa.array(ids % 1000 == 999),
                "truncateds": pa.array(np.zeros(per_file, bool)),
                "module_id": pa.DictionaryArray.from_arrays(
                    pa.array((ids // 1000) % 2, pa.int32()), modules
                ),
            }
        )
        path = root / "all" / f"part-{index:05d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, row_group_size=65_536)
        paths.append(path)
    return paths


def subset(root: Path, name: str, paths: list[Path]) -> Path:
    """A dataset directory holding hard links to ``paths`` (no copies)."""
    directory = root / name
    directory.mkdir()
    for path in paths:
        os.link(path, directory / path.name)
    return directory


def pyarrow_epoch(paths: list[Path]) -> tuple[int, float]:
    """Rows and seconds: read, group per module once, slice zero-copy torch minibatches."""
    from pipeline.streams.columns import column_array, module_codes

    start = time.perf_counter()
    rows = 0
    for path in paths:
        table = pq.read_table(path, columns=[*COLUMNS, "module_id"])
        codes, names = module_codes(table)
        order = np.argsort(codes, kind="stable")
        tensors = {c: torch.from_numpy(column_array(table, c)[order]) for c in COLUMNS}
        bounds = np.searchsorted(codes[order], np.arange(len(names) + 1)).tolist()
        for lo, hi in itertools.pairwise(bounds):
            for first in range(lo, hi - MINIBATCH + 1, MINIBATCH):
                batch = {c: t[first : first + MINIBATCH] for c, t in tensors.items()}
                rows += len(batch["obs"])
    return rows, time.perf_counter() - start


def run_learners(streams: list, batches_per_learner: int) -> float:
    """Seconds for every learner (one thread each) to take its batches."""
    errors: list[BaseException] = []

    def learn(stream) -> None:
        try:
            for _ in stream.take(batches_per_learner):
                pass
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=learn, args=(s,)) for s in streams]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - start


def reference_steady(dataset, epochs: int) -> tuple[int, float]:
    """Rows and seconds of ``epochs`` epochs after a warm-up one, RLlib style: each
    learner keeps one ``iter_torch_batches`` over its split and groups every batch per
    module (as ``MiniBatchRayDataIterator`` builds a ``MultiAgentBatch``)."""
    coded = dataset.map_batches(_module_code_column, batch_format="pyarrow").materialize()
    splits = coded.streaming_split(LEARNERS, equal=True)
    ready = threading.Barrier(LEARNERS + 1)
    counts = [0] * LEARNERS

    def learn(index: int) -> None:
        batches = splits[index].iter_torch_batches(batch_size=MINIBATCH, drop_last=True)
        for batch in batches:
            _group_per_module(batch)
        ready.wait()
        for _ in range(epochs):
            for batch in batches:
                grouped = _group_per_module(batch)
                counts[index] += sum(len(columns["obs"]) for columns in grouped.values())

    seconds = _timed_after_warm_up(learn, ready)
    return sum(counts), seconds


def rllib_steady(dataset, epochs: int) -> tuple[int, float] | None:
    """Rows and seconds of ``epochs`` epochs after a warm-up one through RLlib's own
    per-learner iterator, as its learners build it (``Learner._create_iterator_if_necessary``):
    one persistent ``MiniBatchRayDataIterator`` per ``streaming_split(2, equal=True)`` split,
    ``num_iters`` a learner's minibatches per epoch, RLlib's default ``prefetch_batches=2``.
    RLlib's ``OfflinePreLearner`` hands learners flattened ``module/column`` columns; rows
    of two modules cannot share such columns, so a ``collate_fn`` groups every 512-row batch
    per module into those keys (module ids as integer codes, prepared outside the timing).
    None when ``ray.rllib`` cannot be imported (see the module docstring)."""
    try:
        from ray.rllib.utils.minibatch_utils import MiniBatchRayDataIterator
    except ImportError as error:
        print(f"\nRLlib baseline skipped: cannot import ray.rllib ({error}); see bench/streams.py")
        return None
    coded = dataset.map_batches(_module_code_column, batch_format="pyarrow").materialize()
    splits = coded.streaming_split(LEARNERS, equal=True)
    per_epoch = (coded.count() // LEARNERS) // MINIBATCH
    ready = threading.Barrier(LEARNERS + 1)
    counts = [0] * LEARNERS

    def learn(index: int) -> None:
        minibatches = MiniBatchRayDataIterator(
            iterator=splits[index],
            device="cpu",
            minibatch_size=MINIBATCH,
            num_iters=per_epoch,
            collate_fn=_flat_per_module,
            prefetch_batches=2,
            drop_last=True,
        )
        for _ in minibatches:
            pass
        ready.wait()
        for _ in range(epochs):
            for batch in minibatches:
                counts[index] += batch.env_steps()

    seconds = _timed_after_warm_up(learn, ready)
    return sum(counts), seconds


def _timed_after_warm_up(learn: Callable[[int], None], ready: threading.Barrier) -> float:
    """Seconds from the moment every learner thread (``learn(index)``, one per learner) has
    passed ``ready``, after its warm-up, until all of them finish."""
    threads = [threading.Thread(target=learn, args=(i,)) for i in range(LEARNERS)]
    for thread in threads:
        thread.start()
    ready.wait()
    start = time.perf_counter()
    for thread in threads:
        thread.join()
    return time.perf_counter() - start


def _flat_per_module(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    grouped = _group_per_module({name: torch.from_numpy(array) for name, array in batch.items()})
    return {
        f"{module}/{name}": tensor
        for module, columns in grouped.items()
        for name, tensor in columns.items()
    }


def _module_code_column(table: pa.Table) -> pa.Table:
    from pipeline.streams.columns import module_codes

    codes, names = module_codes(table)
    assert names == list(MODULES), names
    table = table.select(list(COLUMNS))
    return table.append_column("module", pa.array(codes.astype(np.int64)))


def _group_per_module(batch: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    codes = batch.pop("module")
    grouped = {}
    for code, module in enumerate(MODULES):
        mask = codes == code
        grouped[module] = {name: tensor[mask] for name, tensor in batch.items()}
    return grouped


def stream_steady(episodes, epochs: int) -> tuple[int, float]:
    from pipeline.streams.learner_stream import split_for_learners

    streams = split_for_learners(episodes, LEARNERS, minibatch_size=MINIBATCH, seed=0)
    per_epoch = (episodes.num_rows // LEARNERS) // MINIBATCH
    try:
        run_learners(streams, per_epoch)
        seconds = run_learners(streams, epochs * per_epoch)
    finally:
        for stream in streams:
            stream.close()
    return epochs * per_epoch * MINIBATCH * LEARNERS, seconds


def ray_read_epoch(directory: Path) -> tuple[int, float]:
    """Rows and seconds of ``read_episodes``' Ray Dataset alone (Ray's default Parquet
    reader): 16K-row Arrow batches of the same columns, nothing else."""
    from pipeline.reads.episodes import read_episodes

    dataset = read_episodes(directory).dataset.select_columns([*COLUMNS, "module_id"])
    start = time.perf_counter()
    rows = sum(
        batch.num_rows for batch in dataset.iter_batches(batch_size=16384, batch_format="pyarrow")
    )
    return rows, time.perf_counter() - start


def stream_first_epoch(
    directory: Path, cache_budget_mb: float | None = None
) -> tuple[int, float, float]:
    """Rows, streaming seconds, and the seconds read_episodes spent validating."""
    from pipeline.reads.episodes import read_episodes
    from pipeline.rows.options import RowStream
    from pipeline.streams.learner_stream import split_for_learners

    start = time.perf_counter()
    episodes = read_episodes(directory)
    validated = time.perf_counter() - start
    rows = RowStream(episodes, cache_budget_mb=cache_budget_mb)
    streams = split_for_learners(rows, LEARNERS, minibatch_size=MINIBATCH, seed=0)
    per_learner = (episodes.num_rows // LEARNERS) // MINIBATCH
    try:
        seconds = run_learners(streams, per_learner)
    finally:
        for stream in streams:
            stream.close()
    return per_learner * MINIBATCH * LEARNERS, seconds, validated


def peak_rss_child(directory: Path) -> None:
    """In a fresh process: stream one epoch of ``directory``, print peak RSS in bytes."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        _quiet_ray()
        # No cache: the figure is the window bound that data over the cache budget gets.
        rows, _, _ = stream_first_epoch(directory, cache_budget_mb=0)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"rows": rows, "peak_rss": peak}))
    finally:
        ray.shutdown()


def peak_rss(directory: Path) -> dict:
    command = [sys.executable, __file__, "--rss-child", str(directory)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"peak RSS run failed for {directory}:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _quiet_ray() -> None:
    import ray

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def _median(runs: list[tuple[int, float]]) -> tuple[int, float]:
    """The run with the median rate."""
    return sorted(runs, key=lambda run: run[0] / run[1])[len(runs) // 2]


def _rate(rows: int, seconds: float) -> str:
    return f"{rows / seconds / 1e6:6.2f} M rows/s ({rows:,} rows in {seconds:.2f} s)"


def _figure(name: str, ratio: float, target: str, lines: list[str]) -> None:
    print(f"\n{name}: ratio {ratio:.2f} (target {target})")
    for line in lines:
        print(f"  {line}")


def _rows(path: Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def _shape(rows: int, **extra: int) -> dict[str, int]:
    return {
        "rows": rows,
        "files": FILES,
        "obs_floats": 16,
        "modules": len(MODULES),
        "minibatch": MINIBATCH,
        "learners": LEARNERS,
        **extra,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="first-epoch rows (10x RSS)")
    parser.add_argument("--steady-rows", type=int, default=1_000_000, help="steady-epoch rows")
    parser.add_argument("--epochs", type=int, default=2, help="timed steady epochs")
    parser.add_argument("--rounds", type=int, default=3, help="first-epoch rounds (median)")
    parser.add_argument(
        "--quick", action="store_true", help="--rows 500000 --steady-rows 200000 (a quick look)"
    )
    parser.add_argument(
        "--figures",
        default="1,2,2b,3",
        help="the figures to run, comma-separated (default: 1,2,2b,3)",
    )
    parser.add_argument("--rss-child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child is not None:
        peak_rss_child(args.rss_child)
        return
    if args.quick:
        args.rows, args.steady_rows = 500_000, 200_000
    steady_files = max(1, min(FILES, round(args.steady_rows / (args.rows // FILES))))
    root = Path(tempfile.mkdtemp(prefix="offmeta-bench-streams-"))
    try:
        started = time.perf_counter()
        paths = write_dataset(root, args.rows)
        base = subset(root, "base", paths[:1])
        warm = subset(root, "warm", paths[:4])
        steady = subset(root, "steady", paths[:steady_files])
        os.sync()  # no write-back of the new files competes with the timed reads
        print(f"wrote {args.rows:,} rows in {FILES} files ({time.perf_counter() - started:.1f} s)")
        figures = set(args.figures.split(","))
        unknown = figures - {"1", "2", "2b", "3"}
        if unknown:
            parser.error(f"--figures: unknown {sorted(unknown)}; expected some of 1,2,2b,3")
        run_figures(root / "all", base, warm, steady, paths, args.epochs, args.rounds, figures)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_figures(
    full: Path,
    base: Path,
    warm: Path,
    steady: Path,
    paths: list[Path],
    epochs: int,
    rounds: int,
    figures: set[str],
) -> None:
    # Memory first, in fresh processes of their own, before this process starts Ray.
    if "3" in figures:
        small, large = peak_rss(base), peak_rss(full)
    import ray

    from pipeline.reads.episodes import read_episodes

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        _quiet_ray()
        # Start both of Ray's workers and warm both read paths (imports, first tasks): the
        # stream reads tasks of up to 16 MiB of files, so four files of the 1M-row data (two
        # of larger ones) keep both workers busy.
        read_episodes(warm).dataset.take(1)
        stream_first_epoch(warm)

        if "1" in figures:
            first_epoch(full, paths, rounds)
        if "2" in figures or "2b" in figures:
            steady_epochs(steady, epochs, figures)
    finally:
        ray.shutdown()
    if "3" in figures:
        peak_rss_figure(small, large, paths)


def first_epoch(full: Path, paths: list[Path], rounds: int) -> None:
    # Rounds of both, alternating, and the median of their ratios: this machine is
    # shared, and one round can run at half speed.
    streams, arrows, validated = [], [], 0.0
    for _ in range(rounds):
        rows, seconds, validated = stream_first_epoch(full)
        streams.append((rows, seconds))
        arrows.append(pyarrow_epoch(paths))
    ratios = [(r1 / s1) / (r2 / s2) for (r1, s1), (r2, s2) in zip(streams, arrows, strict=True)]
    stream_rows, stream_s = _median(streams)
    arrow_rows, arrow_s = _median(arrows)
    ray_rows, ray_s = ray_read_epoch(full)
    first_ratio = sorted(ratios)[len(ratios) // 2]
    _figure(
        "1. first epoch from disk: LearnerStream / pyarrow (median of the rounds' ratios)",
        first_ratio,
        ">= 0.7",
        [
            f"LearnerStream {_rate(stream_rows, stream_s)}, median of {rounds}",
            f"pyarrow       {_rate(arrow_rows, arrow_s)}, median of {rounds}",
            "ratio per round: " + ", ".join(f"{ratio:.2f}" for ratio in ratios),
            f"read_episodes' Dataset alone (default reader, same columns, 16K-row "
            f"batches, no shuffle or collate): {_rate(ray_rows, ray_s)}",
            f"(read_episodes validation and fingerprint, not timed above: {validated:.2f} s)",
        ],
    )
    write_record(
        "streams",
        "1-first-epoch",
        "first epoch from disk, LearnerStream rows/s (median of the rounds); ratio: "
        "median of the rounds' ratios",
        stream_rows / stream_s,
        "rows/s",
        baseline=Baseline(
            "pyarrow read + group per module + zero-copy 512-row slices, rows/s",
            arrow_rows / arrow_s,
        ),
        ratio=first_ratio,
        target=">= 0.7",
        shape=_shape(len(paths) * _rows(paths[0]), rounds=rounds),
        details={
            "round_ratios": ratios,
            "ray_dataset_alone_rows_per_s": ray_rows / ray_s,
            "validation_s": validated,
        },
    )


def steady_epochs(steady: Path, epochs: int, figures: set[str]) -> None:
    from pipeline.reads.episodes import read_episodes

    episodes = read_episodes(steady)
    cached = dataclasses.replace(episodes, dataset=episodes.dataset.materialize())
    ours_rows, ours_s = stream_steady(cached, epochs)
    # The same stream over the files: the first epoch read, later ones kept in memory.
    plain = stream_steady(episodes, epochs)
    print(f"\nLearnerStream over the files, later epochs kept in memory: {_rate(*plain)}")
    if "2" in figures:
        ref_rows, ref_s = reference_steady(cached.dataset, epochs)
        _figure(
            "2. steady epochs: LearnerStream / iter_torch_batches per streaming_split",
            (ours_rows / ours_s) / (ref_rows / ref_s),
            ">= 10",
            [
                f"LearnerStream {_rate(ours_rows, ours_s)}",
                f"reference     {_rate(ref_rows, ref_s)}",
            ],
        )
        write_record(
            "streams",
            "2-steady-epochs",
            "steady epochs on a materialized dataset, LearnerStream rows/s",
            ours_rows / ours_s,
            "rows/s",
            baseline=Baseline(
                "one persistent iter_torch_batches(512) per streaming_split split, grouped "
                "per module (RLlib style), rows/s",
                ref_rows / ref_s,
            ),
            target=">= 10",
            shape=_shape(episodes.num_rows, epochs=epochs),
        )
    if "2b" in figures:
        rllib = rllib_steady(cached.dataset, epochs)
        if rllib is not None:
            rllib_rows, rllib_s = rllib
            _figure(
                "2b. steady epochs: LearnerStream / RLlib's MiniBatchRayDataIterator per "
                "streaming_split",
                (ours_rows / ours_s) / (rllib_rows / rllib_s),
                ">= 15",
                [f"LearnerStream {_rate(ours_rows, ours_s)}", f"RLlib         {_rate(*rllib)}"],
            )
            write_record(
                "streams",
                "2b-steady-epochs-rllib",
                "steady epochs on a materialized dataset, LearnerStream rows/s",
                ours_rows / ours_s,
                "rows/s",
                baseline=Baseline(
                    "RLlib's MiniBatchRayDataIterator (512-row minibatches, per module) per "
                    "streaming_split(2, equal=True) split, rows/s",
                    rllib_rows / rllib_s,
                ),
                target=">= 15",
                shape=_shape(episodes.num_rows, epochs=epochs),
            )


def peak_rss_figure(small: dict, large: dict, paths: list[Path]) -> None:
    _figure(
        "3. peak RSS streaming 10x the rows / base",
        large["peak_rss"] / small["peak_rss"],
        "<= 1.5",
        [f"{r['rows']:,} rows: {r['peak_rss'] / 2**20:.0f} MiB" for r in (small, large)],
    )
    write_record(
        "streams",
        "3-peak-rss",
        "peak RSS of a process streaming one epoch of all the rows",
        large["peak_rss"] / 2**20,
        "MiB",
        baseline=Baseline(
            "peak RSS streaming one file (a tenth of the rows)", small["peak_rss"] / 2**20
        ),
        target="<= 1.5",
        shape=_shape(len(paths) * _rows(paths[0]), base_rows=_rows(paths[0])),
    )


if __name__ == "__main__":
    main()
