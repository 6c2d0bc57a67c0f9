"""Where ``make run``'s seconds go: ``offmeta run`` on the point-robot sample, timed per stage.

Each round runs ``offmeta run --config flows/configs/point_robot.yaml`` (what ``make run``
runs) as a fresh process, into fresh run and artifact folders, and reads the line the run
ends with (``took ...: ... before the flow, validate ..., train ..., ...``; see
``flows.stages.timings``); the process's wall time is measured outside it, so the Prefect
server's stop at exit counts too. Figures:

- ``wall-over-training``: the process's wall time against the train stage's seconds in the
  same run (target: <= 1.5x, issue 23);
- ``wall-over-training-server``: the same with a Prefect server already running (one the
  bench starts first and hands over through ``PREFECT_API_URL``, as scheduled runs have),
  so that the temporary server's boot is not part of the run;
- with ``--compare CHECKOUT`` (another checkout of offmeta, e.g. a worktree of an earlier
  commit, run with this one's virtual environment): ``wall-vs-compared``, this checkout's wall
  time against that one's, rounds alternating between the two.

The first round of each checkout is a warm-up (Prefect's database, the OS file cache) and
is not counted. Run: ``.venv/bin/python bench/startup.py [--rounds R] [--compare DIR]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.records import Baseline, write_record
from flows.stages.timings import read_line

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "flows/configs/point_robot.yaml"


def run_once(checkout: Path, scratch: Path, api_url: str | None = None) -> dict[str, float]:
    """One ``offmeta run`` of ``checkout`` (recording to ``api_url``, or to a temporary
    server): its wall time and, when it prints them, the seconds of each stage."""
    with tempfile.TemporaryDirectory(dir=scratch) as where:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        env.pop("PREFECT_API_URL", None)
        if api_url is not None:
            env["PREFECT_API_URL"] = api_url
        began = time.perf_counter()
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from flows.cli import run; run()",
                "run",
                "--config",
                str(checkout / CONFIG),
                "--set",
                f"training.checkpoint_dir={where}/runs",
                "--set",
                f"artifacts.root={where}/artifacts",
            ],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        wall = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"offmeta run in {checkout} failed:\n{done.stderr[-3000:]}")
    return {"wall": wall, **(read_line(done.stdout) or {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="counted rounds (default 3)")
    parser.add_argument("--compare", type=Path, help="another offmeta checkout to time too")
    args = parser.parse_args()
    checkouts = [ROOT] + ([args.compare.resolve()] if args.compare else [])
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        # One Prefect home for the bench, so every round finds the same database.
        os.environ["PREFECT_HOME"] = str(scratch / "prefect-home")
        for checkout in checkouts:
            run_once(checkout, scratch)
        rounds: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
        for index in range(args.rounds):
            for checkout in checkouts:
                times = run_once(checkout, scratch)
                rounds[checkout].append(times)
                shown = ", ".join(f"{k} {v:.1f}" for k, v in times.items())
                print(f"round {index + 1} {checkout.name}: {shown}", flush=True)
        served = _with_a_running_server(scratch, args.rounds)
    ours = rounds[ROOT]
    ratios = [r["wall"] / r["train"] for r in ours]
    stages = sorted({k for r in ours for k in r})
    breakdown = {k: [round(r.get(k, 0.0), 2) for r in ours] for k in stages}
    shape = {"config": CONFIG, "rounds": args.rounds}
    wall = statistics.median(r["wall"] for r in ours)
    train = statistics.median(r["train"] for r in ours)
    ratio = statistics.median(ratios)
    print(
        f"make run: wall {wall:.1f} s, train stage {train:.1f} s: {ratio:.2f}x "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}x; target <= 1.5x)"
    )
    print("  seconds per round: " + "; ".join(f"{k} {v}" for k, v in breakdown.items()))
    write_record(
        "startup",
        "wall-over-training",
        "offmeta run on the point-robot sample (make run): process wall time against its "
        "train stage, same run; median of per-round ratios",
        wall,
        "s",
        baseline=Baseline("the run's train stage (task samples and meta-steps)", train),
        ratio=ratio,
        target="<= 1.5",
        shape=shape,
        details={"seconds_per_round": breakdown, "ratios": ratios},
    )
    served_ratios = [r["wall"] / r["train"] for r in served]
    served_wall = statistics.median(r["wall"] for r in served)
    served_train = statistics.median(r["train"] for r in served)
    print(
        f"with a running Prefect server: wall {served_wall:.1f} s, train stage "
        f"{served_train:.1f} s: {statistics.median(served_ratios):.2f}x (rounds "
        f"{min(served_ratios):.2f}-{max(served_ratios):.2f}x)"
    )
    write_record(
        "startup",
        "wall-over-training-server",
        "offmeta run on the point-robot sample, recording to a Prefect server already "
        "running (PREFECT_API_URL): process wall time against its train stage, same run; "
        "median of per-round ratios",
        served_wall,
        "s",
        baseline=Baseline("the run's train stage (task samples and meta-steps)", served_train),
        ratio=statistics.median(served_ratios),
        target="<= 1.5",
        shape=shape,
        details={
            "seconds_per_round": {
                k: [round(r.get(k, 0.0), 2) for r in served] for k in sorted(served[0])
            },
            "ratios": served_ratios,
        },
    )
    if args.compare:
        theirs = rounds[checkouts[1]]
        per_round = [a["wall"] / b["wall"] for a, b in zip(ours, theirs, strict=True)]
        compared = statistics.median(r["wall"] for r in theirs)
        print(
            f"against {checkouts[1]}: wall {wall:.1f} s vs {compared:.1f} s: "
            f"{statistics.median(per_round):.2f}x (rounds {min(per_round):.2f}-"
            f"{max(per_round):.2f}x)"
        )
        write_record(
            "startup",
            "wall-vs-compared",
            f"offmeta run on the point-robot sample: wall time against the checkout "
            f"{checkouts[1].name} (rounds alternating); median of per-round ratios",
            wall,
            "s",
            baseline=Baseline(f"offmeta run of {checkouts[1].name}", compared),
            ratio=statistics.median(per_round),
            shape=shape,
            details={"ours": [r["wall"] for r in ours], "theirs": [r["wall"] for r in theirs]},
        )


def _with_a_running_server(scratch: Path, rounds: int) -> list[dict[str, float]]:
    """``rounds`` runs of this checkout recording to one Prefect server started first."""
    from flows.process.prefect_server import PrefectApi

    os.environ.pop("PREFECT_API_URL", None)
    server = PrefectApi()
    try:
        server.wait()
        url = os.environ["PREFECT_API_URL"]
        run_once(ROOT, scratch, url)  # warm-up
        times = []
        for index in range(rounds):
            times.append(run_once(ROOT, scratch, url))
            shown = ", ".join(f"{k} {v:.1f}" for k, v in times[-1].items())
            print(f"round {index + 1} with a running server: {shown}", flush=True)
        return times
    finally:
        server.stop()
        os.environ.pop("PREFECT_API_URL", None)


if __name__ == "__main__":
    main()
