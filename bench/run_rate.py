"""`offmeta run`'s training rate against the bare meta-step on the same shape, same machine.

The measured: `offmeta run --config CONFIG` (default the shipped Meta-World reach config on
its committed sample: the context learner, 12 tasks of one 50-step support window and Q = 50,
encoder 83-256-256-16, policy 55-256-256-4, `compile: default`) in a process of its own, with
N iterations, a progress line every M, checkpoints and artifacts in a temporary folder. Its
steady-state rate is read from the progress lines' timestamps: from the first line (the
compilation and the start-up are behind it) to the last, the meta-steps of the run itself with
its checkpoints, progress reports and task feed. The whole training stage's rate (sampling
set-up, compilation and all: N over the `train` seconds the run reports) is the second figure.

The baseline: the bare `MetaLearner.step` as the run builds it (`learner_config`, the
config's compile mode and torch threads, seeded the same) on meta-batches of the same task
stream (`split_for_learners` as `flows.stages.train` calls it), prefetched into memory, after
its compilation and warm-up: no logging, no checkpoints, no feed. Its rate is the best of
blocks of M steps (the progress period), timed before and after each run; the run's best
period is printed beside it for a like-for-like look. Both sides run with the malloc settings
of `flows.process.heap` (the run sets them itself, this process for the bare step); the run's
peak resident memory is recorded beside them.

Both figures are ratios run / bare (target for the steady rate: >= 1/1.2, i.e. 0.83),
written as records (`bench/records.py`) with the machine's load before and after, torch
threads, iterations and whether each side ran the compiled step. Beside them, CPU seconds
per step: the bare process's, and the run's by thread (from /proc at each progress line; the
training loop runs on the main thread, the task feed, prefetch, Prefect and Ray threads on
others), which other jobs' load changes far less than wall time. On the shared 2-core machine
the wall figures are noisy: nice does not order processes of other sessions (the kernel's
autogroups share the cores between sessions), and the load moves between the bare blocks and
the run; read the load and the CPU per step beside the ratio.

Run: ``PYTHONPATH=. .venv/bin/python bench/run_rate.py [--quick] [--iterations N]
[--log-every M] [--rounds R] [--config FILE] [--set KEY=VALUE ...]`` (``--quick``: 400
iterations, one round, a smoke of a few minutes; no record is written for it unless
``--record``). The committed sample gives one meta-batch per epoch, so the task feed plans an
epoch for every step there; ``--set data.train=... --set data.heldout=...`` measures on a full
recording, whose epochs hold many meta-batches (the record's shape says how many).
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import Baseline, write_record
from flows.process.heap import keep_freed_memory
from flows.process.runtime import set_quiet_environment
from flows.stages.timings import read_line

if TYPE_CHECKING:
    from flows.config import MetaTrainConfig
    from learners.meta.learner import MetaLearner
    from learners.meta.meta_batch import MetaBatch

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "flows" / "configs" / "metaworld_reach.yaml"
OFFMETA = ROOT / ".venv" / "bin" / "offmeta"
TARGET = 1 / 1.2

_CLOCK = r"(\d\d):(\d\d):(\d\d\.\d+) \| \w+ +\| "  # Prefect's console time of day
_PROGRESS = re.compile(_CLOCK + r"Task run 'train-[^']*' - iteration (\d+)/(\d+) ")
_COMPILED = re.compile(
    _CLOCK + r"learners\.meta\.compiled_step - compiled the meta-step .* in ([0-9.]+) s"
)
_EAGER = re.compile(r"MetaConfig\.compile=.*the meta-step runs eager")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) each thread of process `pid` has used so far, summed by
    thread name (the main thread's as "main"), from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    used: dict[str, float] = {}
    for task in (Path("/proc") / str(pid) / "task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        name, fields = stat.split(" (", 1)[1].rsplit(") ", 1)
        name = "main" if task.name == str(pid) else name
        utime, stime = fields.split()[11:13]
        used[name] = used.get(name, 0.0) + (int(utime) + int(stime)) / tick
    return used


class RunRate(NamedTuple):
    """What one `offmeta run`'s output says about its training."""

    steady: float
    """Iterations/s from the first progress line after the (last) compilation to the last."""
    whole: float
    """Iterations/s over the whole training stage (its reported seconds)."""
    best_period: float
    """Iterations/s of the fastest period between two of those progress lines."""
    first: int
    """The iteration of the first progress line (the steady rate counts from it)."""
    last: int
    train_s: float
    compiled: bool
    """Whether the run's learner compiled its meta-step (and did not fall back to eager)."""
    compile_s: float | None
    cpu_per_step: dict[str, float] | None = None
    """CPU seconds per steady-state step by thread name ("main": the training loop's), for
    the threads that used any."""


def read_run(output: str, cpu: dict[int, dict[str, float]] | None = None) -> RunRate:
    """The rates in an `offmeta run` output: its progress lines, its `took` line, and the
    compiled step's log line (shown at log level INFO); with `cpu` (the run's CPU time when
    each progress line was read, by iteration), its CPU time per steady-state step."""
    points: list[tuple[int, float]] = []  # (iteration, clock seconds) of each progress line
    compiles: list[float] = []  # compile seconds of each compilation
    day, previous = 0.0, 0.0
    for line in output.splitlines():
        found = _PROGRESS.match(line) or _COMPILED.match(line)
        if found is None:
            continue
        clock = 3600 * int(found.group(1)) + 60 * int(found.group(2)) + float(found.group(3))
        if clock + day < previous:  # past midnight
            day += 86400.0
        previous = clock + day
        if found.re is _COMPILED:
            # The steady rate counts from the first progress line after the last compilation.
            points.clear()
            compiles.append(float(found.group(4)))
        else:
            points.append((int(found.group(4)), previous))
    if len(points) < 2:
        raise ValueError(
            f"found {len(points)} progress lines after the compilation in the run's output, "
            "expected at least 2: run more iterations or log more often (training.log_every)"
        )
    took = read_line(output)
    if took is None or "train" not in took:
        raise ValueError("the run's output has no 'took ... train N s' line; did it finish?")
    periods = [
        (i1 - i0) / (t1 - t0) for (i0, t0), (i1, t1) in itertools.pairwise(points) if t1 > t0
    ]
    train_s = took["train"]
    (first, start), (last, end) = points[0], points[-1]
    cpu_per_step = None
    if cpu is not None and first in cpu and last in cpu:
        before, after = cpu[first], cpu[last]
        spent = {name: after[name] - before.get(name, 0.0) for name in after}
        cpu_per_step = {name: s / (last - first) for name, s in spent.items() if s > 0}
    return RunRate(
        steady=(last - first) / (end - start),
        whole=last / train_s,
        best_period=max(periods, default=float("nan")),
        first=first,
        last=last,
        train_s=train_s,
        compiled=bool(compiles) and _EAGER.search(output) is None,
        compile_s=sum(compiles) if compiles else None,
        cpu_per_step=cpu_per_step,
    )


def _overrides(args: argparse.Namespace, folder: Path) -> list[str]:
    """The run's config overrides: ``--set``'s, then its length and a folder of its own."""
    return [
        *args.overrides,
        f"training.iterations={args.iterations}",
        f"training.log_every={args.log_every}",
        f"training.checkpoint_dir={folder / 'runs'}",
        f"artifacts.root={folder / 'artifacts'}",
    ]


class Finished(NamedTuple):
    """A finished `offmeta run`: its output, wall seconds, its CPU time when each progress
    line was read (by iteration) and its peak resident memory by then."""

    output: str
    wall_s: float
    cpu: dict[int, dict[str, float]]
    peak_rss_mib: float | None


def peak_rss_mib(pid: int) -> float | None:
    """Process `pid`'s peak resident set so far (VmHWM, Linux), MiB; None when unreadable."""
    try:
        status = (Path("/proc") / str(pid) / "status").read_text()
    except OSError:
        return None
    found = re.search(r"^VmHWM:\s+(\d+) kB", status, re.MULTILINE)
    return int(found.group(1)) / 1024 if found else None


def run_offmeta(config: Path, overrides: list[str]) -> Finished:
    """`offmeta run` of this checkout in a process of its own."""
    command = [str(OFFMETA), "run", "--config", str(config)]
    for override in overrides:
        command += ["--set", override]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # Library INFO lines reach the console: the compiled step's says when it compiled.
        "PREFECT_LOGGING_ROOT_LEVEL": "INFO",
        "PREFECT_LOGGING_COLORS": "false",
    }
    lines, cpu, peak = [], {}, None
    started = time.perf_counter()
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            progress = _PROGRESS.match(line)
            if progress is not None:
                cpu[int(progress.group(4))] = thread_cpu(process.pid)
                peak = peak_rss_mib(process.pid) or peak
    wall = time.perf_counter() - started
    output = "".join(lines)
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {process.returncode}:\n{output[-4000:]}")
    return Finished(output, wall, cpu, peak)


class Bare(NamedTuple):
    """The bare meta-step: the learner as the run builds it and meta-batches of its stream."""

    learner: MetaLearner
    batches: list[MetaBatch]
    compiled: bool
    compile_s: float
    samples: dict[str, Any]
    """The task samples' summary (as the run logs it): support and query rows per task."""


def bare_step(cfg: MetaTrainConfig, count: int) -> Bare:
    """A `MetaLearner` as `flows.stages.train.train` builds one for `cfg`, compiled and warmed
    up, and `count` meta-batches of the same task stream, in memory."""
    import logging

    import ray
    import torch

    from flows.stages.datasets import validate_datasets
    from flows.stages.normalization import learner_config
    from flows.stages.train import build_task_samples, training_stream
    from learners.meta.learner import MetaLearner

    quiet = logging.getLogger("bench.run_rate")
    quiet.propagate = False
    ray.init(num_cpus=cfg.ray.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        data = validate_datasets(cfg).train
        samples = build_task_samples(cfg, data, quiet)
        summary = samples.summary()
        training = cfg.training
        stream = training_stream(cfg, samples, device=training.device)
        with stream:
            batches = list(stream.take(count))
        learner = MetaLearner(learner_config(cfg, data), device=training.device)
    finally:
        ray.shutdown()
    torch.manual_seed(cfg.training.seed)
    for batch in batches[:5]:
        learner.step(batch)
    learner.check_finite()
    compiled = learner.compiled_step
    used = compiled is not None and compiled.fallback is None
    return Bare(learner, batches, used, compiled.compile_seconds if used else 0.0, summary)


class Block(NamedTuple):
    """One timed block of bare meta-steps."""

    rate: float
    """Iterations/s."""
    cpu_per_step: float
    """CPU seconds per step, every thread of this process."""


def bare_blocks(bare: Bare, steps: int, blocks: int) -> list[Block]:
    """`blocks` timed blocks of `steps` bare meta-steps each, on the prefetched meta-batches
    in turn."""
    timed = []
    for _ in range(blocks):
        cpu, started = time.process_time(), time.perf_counter()
        for k in range(steps):
            bare.learner.step(bare.batches[k % len(bare.batches)])
        bare.learner.check_finite()
        wall = time.perf_counter() - started
        timed.append(Block(steps / wall, (time.process_time() - cpu) / steps))
    return timed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=CONFIG, help="the run config (YAML)")
    parser.add_argument("--iterations", type=int, default=3000, help="the run's iterations")
    parser.add_argument("--log-every", type=int, default=250, help="the run's progress period")
    parser.add_argument("--rounds", type=int, default=1, help="runs (bare blocks around each)")
    parser.add_argument("--blocks", type=int, default=4, help="bare blocks before and after")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for both sides, e.g. data.train=DIR (the shape's records say it)",
    )
    parser.add_argument("--quick", action="store_true", help="400 iterations: a smoke")
    parser.add_argument("--record", action="store_true", help="write records with --quick too")
    args = parser.parse_args(argv)
    if args.quick:
        args.iterations, args.log_every, args.rounds, args.blocks = 400, 50, 1, 2
    set_quiet_environment()
    import torch

    from flows.config import load_config

    # The bare step gets the malloc settings `offmeta run` gives its training thread.
    kept = keep_freed_memory()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="offmeta-run-rate-") as tmp:
        folder = Path(tmp)
        cfg = load_config(args.config, _overrides(args, folder))
        if cfg.training.torch_threads is not None:
            torch.set_num_threads(cfg.training.torch_threads)
        bare = bare_step(cfg, min(args.log_every, 200))
        mode = "compiled" if bare.compiled else "eager"
        print(f"bare step {mode} (compile {bare.compile_s:.0f} s)", flush=True)
        blocks = bare_blocks(bare, args.log_every, args.blocks)
        runs, walls, peaks = [], [], []
        for index in range(args.rounds):
            at = folder / f"round-{index}"
            finished = run_offmeta(args.config, _overrides(args, at))
            runs.append(read_run(finished.output, finished.cpu))
            walls.append(finished.wall_s)
            peaks.append(finished.peak_rss_mib)
            blocks += bare_blocks(bare, args.log_every, args.blocks)
            print(f"round {index + 1}: {runs[-1]}", flush=True)
    load_after = os.getloadavg()
    best = max(block.rate for block in blocks)
    steady = statistics.median(run.steady for run in runs)
    whole = statistics.median(run.whole for run in runs)
    bare_cpu = min(block.cpu_per_step for block in blocks)
    print(f"bare blocks, it/s: {', '.join(f'{block.rate:.1f}' for block in blocks)}")
    print(
        f"offmeta run steady {steady:.1f} it/s / bare step {best:.1f} it/s = "
        f"{steady / best:.3f} (target >= {TARGET:.2f}); whole training stage {whole:.1f} it/s "
        f"= {whole / best:.3f}; CPU per step: bare {bare_cpu * 1e3:.1f} ms, run {_cpu(runs)}; "
        f"load {load_before[0]:.1f} -> {load_after[0]:.1f} on {os.cpu_count()} cores, torch "
        f"threads {torch.get_num_threads()}"
    )
    if args.quick and not args.record:
        return 0
    learners = cfg.learners
    shape = {
        "config": args.config.stem,
        "algorithm": learners.algorithm,
        "tasks": cfg.tasks.meta_batch,
        "support": bare.samples["support"],
        "query": bare.samples["query"],
        "compile": learners.compile,
        "iterations": args.iterations,
        "log_every": args.log_every,
        "meta_batches_per_epoch": bare.samples["samples_per_epoch"] // cfg.tasks.meta_batch,
        **({"overrides": sorted(args.overrides)} if args.overrides else {}),
    }
    details = {
        "load_before": list(load_before),
        "load_after": list(load_after),
        "torch_threads": torch.get_num_threads(),
        "bare_compiled": bare.compiled,
        "bare_compile_s": bare.compile_s,
        "bare_blocks_it_s": [block.rate for block in blocks],
        "bare_cpu_s_per_step": [block.cpu_per_step for block in blocks],
        "runs": [run._asdict() for run in runs],
        "run_wall_s": walls,
        "run_peak_rss_mib": peaks,
        "malloc": "kept (flows.process.heap)" if kept else "glibc defaults",
        "rounds": args.rounds,
    }
    baseline = Baseline(
        f"bare MetaLearner.step ({mode}) on meta-batches of the same stream in memory, "
        f"best block of {args.log_every} steps, it/s",
        best,
    )
    name = args.config.stem.replace("_", "-")
    write_record(
        "run_rate",
        f"1-steady-{name}",
        "offmeta run, training iterations/s from its first progress line after compiling to "
        "its last (start-up and compilation excluded; median of the rounds)",
        steady,
        "it/s",
        baseline=baseline,
        target=f">= {TARGET:.2f}",
        shape=shape,
        details=details,
    )
    write_record(
        "run_rate",
        f"2-whole-{name}",
        "offmeta run, iterations over the seconds of its whole training stage (sampling set-up "
        "and compilation included; median of the rounds)",
        whole,
        "it/s",
        baseline=baseline,
        shape=shape,
        details=details,
    )
    return 0


def _cpu(runs: list[RunRate]) -> str:
    """Each run's CPU ms per step, in all and by its busiest threads."""
    said = []
    for run in runs:
        if run.cpu_per_step is None:
            said.append("not read")
            continue
        busiest = sorted(run.cpu_per_step.items(), key=lambda item: -item[1])[:4]
        parts = ", ".join(f"{name} {s * 1e3:.1f}" for name, s in busiest)
        said.append(f"{sum(run.cpu_per_step.values()) * 1e3:.1f} ms ({parts})")
    return "; ".join(said)


if __name__ == "__main__":
    raise SystemExit(main())
