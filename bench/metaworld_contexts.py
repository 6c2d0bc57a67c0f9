"""How much a held-out goal's success depends on the context drawn for it, by context length.

A published learner (a run's artifact) is evaluated again, ``--draws`` times per context
length: draw d is the run's own held-out evaluation (``flows.evaluation.heldout.evaluate``,
the config's rollouts) with ``evaluation.seed = d`` and ``evaluation.context_window`` set to
the length, so each draw adapts every goal on another of its recorded episodes (and, for a
window, another stretch of it). The figures per length: success at any step and at the last
step and the return, mean ± standard error over the draws. The record: success at any step
with the last length given against the first, measured in the same process on the same
learner and goals (report only: no target).

Point ``--split`` at a folder with ``train/`` and ``heldout/`` (``bench/metaworld.py``'s
validation split ``DATA/reach/validation-10``, where settings are chosen, or the recording's
own skill folder); ``--artifacts`` at the run's artifact store.

Run: ``PYTHONPATH=. .venv/bin/python bench/metaworld_contexts.py --config
flows/configs/metaworld_reach.yaml --artifacts RUN/artifacts --split DATA/reach/validation-10
[--draws 4] [--windows null whole] [--name NAME@latest]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

# Run as a script, this folder comes first on sys.path, where bench/metaworld.py would shadow
# the `metaworld` package (the evaluation's simulator) and bench/learners.py the `learners`
# package: this folder leaves sys.path and the repository root comes first.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from bench.metaworld import mean_and_error  # noqa: E402
from bench.records import Baseline, write_record  # noqa: E402
from flows.process.runtime import set_quiet_environment  # noqa: E402

FIGURES = ("success_any", "success_final", "return")


def draws(
    config: Path, overrides: list[str], state: dict[str, Any], window: str, count: int
) -> list[dict[str, Any]]:
    """The evaluation's figures for the learner in ``state`` with ``count`` draws of every
    goal's context at ``window`` (``config`` with ``overrides``: the split's data)."""
    from flows.config import load_config
    from flows.evaluation.heldout import evaluate
    from flows.stages.datasets import validate_datasets

    base = load_config(config, [*overrides, f"evaluation.context_window={window}"])
    # The data and its checks are the same for every draw: validated once per length.
    heldout = validate_datasets(base).heldout
    measured = []
    for draw in range(count):
        settings = base.evaluation.model_copy(update={"seed": draw})
        report = evaluate(base.model_copy(update={"evaluation": settings}), state, heldout)
        if report.success is None or report.returns is None:
            raise SystemExit(f"{config}: its evaluation rolls nothing out (evaluation.env)")
        measured.append(
            {
                "success_any": report.success["adapted"],
                "success_final": (report.success_final or {}).get("adapted", float("nan")),
                "return": report.returns["adapted"],
                "context": report.context,
                "goals": report.tasks,
            }
        )
        print(
            f"  window {window}, draw {draw}: success {measured[-1]['success_any']:.2f} / last "
            f"step {measured[-1]['success_final']:.2f}, return {measured[-1]['return']:.1f}",
            flush=True,
        )
    return measured


def summary(measured: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    """Mean and standard error over the draws of each figure."""
    return {key: mean_and_error([m[key] for m in measured]) for key in FIGURES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="the run's config (YAML)")
    parser.add_argument("--artifacts", required=True, help="the run's artifact store")
    parser.add_argument("--split", type=Path, required=True, help="folder with train/, heldout/")
    parser.add_argument("--name", help="the artifact (default: the config's, @latest)")
    parser.add_argument("--draws", type=int, default=4, help="contexts drawn per goal")
    parser.add_argument(
        "--windows", nargs="+", default=["null", "whole"], help="context lengths, first = baseline"
    )
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    if args.draws < 1 or len(args.windows) < 2:
        parser.error("expected --draws >= 1 and at least two --windows (the first: the baseline)")
    set_quiet_environment()
    import ray

    from flows.config import load_config
    from pipeline.consumer import load_learner

    split = [f"data.train={args.split / 'train'}", f"data.heldout={args.split / 'heldout'}"]
    name = args.name or f"{load_config(args.config, split).artifacts.name}@latest"
    state = load_learner(name, root=args.artifacts).get_state()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        by_window = {
            window: draws(args.config, split, state, window, args.draws) for window in args.windows
        }
    finally:
        ray.shutdown()
    figures = {window: summary(measured) for window, measured in by_window.items()}
    for window, figure in figures.items():
        shown = ", ".join(f"{key} {mean:.3g} ± {se:.2g}" for key, (mean, se) in figure.items())
        print(f"window {window} ({by_window[window][0]['context']}): {shown}")
    first, last = args.windows[0], args.windows[-1]
    if args.no_record:
        return 0
    path = write_record(
        "metaworld_contexts",
        f"context-draws-{args.config.stem}-{args.split.name}",
        f"{args.config.stem} on {args.split.name}: adapted success (any step) over "
        f"{args.draws} draws of each goal's recorded context of {last!r} steps, mean",
        figures[last]["success_any"][0],
        "success rate",
        baseline=Baseline(
            f"the same draws of {first!r} steps (evaluation.context_window), mean",
            figures[first]["success_any"][0],
        )
        if figures[first]["success_any"][0] > 0
        else None,
        shape={
            "config": args.config.stem,
            "split": args.split.name,
            "goals": by_window[last][0]["goals"],
            "draws": args.draws,
            "windows": args.windows,
        },
        details={
            "artifact": f"{name} in {args.artifacts}",
            "figures": {w: {k: list(v) for k, v in f.items()} for w, f in figures.items()},
            "draws": by_window,
        },
    )
    print(f"record: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
