"""Offline meta-RL on Meta-World ML1 (reach-v3, push-v3; pick-place-v3, context learner
only): the context learner, MAML behaviour cloning and MACAW, trained and evaluated through
``offmeta run``, 3 seeds each.

1. Data: the full sets of ``data/samples/regenerate_metaworld.sh --full DATA`` (recorded
   when missing; 40 train and 10 held-out goals per skill, 12 episodes of 500 steps per goal:
   the scripted expert given the goal at action noise 0.1, 0.5 and 1.0, and a uniform random
   policy, 3 episodes each). The behaviour data's success and return are read from the
   held-out split: the episodes an adapted policy's support transitions come from.
2. Runs: ``offmeta run --config flows/configs/metaworld_<skill>[_macaw].yaml`` with the full
   sets and ``training.seed`` = ``tasks.seed`` = the seed, as a subprocess (checkpoints,
   artifact, pictures as usual, under ``--work``). Each run evaluates on the 10 held-out goals:
   the meta-policy unadapted, adapted on each goal's K support transitions, and the scripted
   expert, one 500-step episode each (every reset of an ML1 task starts from the same state and
   the policies act on their mean). The published manifest's metrics are the figures.
3. Records: one per (skill, algorithm, seed): held-out success (any step) after adaptation,
   baseline the expert's; then per skill the summaries the targets are on: reach, adapted
   success of each algorithm over seeds (target >= 0.9); push, the context learner's adapted
   success (target >= 0.6), MACAW's lead over MAML cloning in standard errors of the
   difference (target >= 2) and, with ``context`` and ``context-rl`` summed up together
   (``--algorithms context context-rl``), offline RL's adapted return over cloning's (target
   >= 1); pick-place, the context learner's adapted success, recorded and reported without a
   target. ``bench/readme_table.py`` builds the results table of docs/metaworld.md from them.

4. Recording (b), the published protocol (``--recording b``, bench/metaworld_published.py):
   the records name the recording, every run's returns are normalised by the held-out
   episodes' mean return (those ``data.episodes_where.heldout`` keeps), and with ``--online``
   each finished run's final checkpoint is evaluated again with context collected online
   (``--online-set KEY=VALUE`` over ``evaluation.context=online``,
   ``evaluation.context_episodes=5``), recorded in the run's record beside its offline
   figures; the summaries are the normalised returns over seeds.

Run: ``.venv/bin/python bench/metaworld.py [--skills reach push pick-place]
[--algorithms context maml macaw] [--seeds 0 1 2] [--iterations N] [--data DIR] [--work DIR]
[--recording a|b] [--online] [--online-set KEY=VALUE] [--no-record]``. Without --skills:
reach and push. Needs metaworld in the environment (the ``test`` extra). About 3-6 minutes
per run of recording (a) on the 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from flows.config import EvaluationConfig
    from pipeline.reads.selection import EpisodeFilter

# Run as a script, this folder comes first on sys.path and bench/learners.py would shadow the
# `learners` package; the repository root must come first.
# This file's own name shadows the metaworld package too, so the folder leaves sys.path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.metaworld_published import (  # noqa: E402
    ONLINE_DEFAULTS,
    RECORDINGS,
    check_recording,
    evaluate_online,
    normalised,
    record_summary,
)
from bench.metaworld_validation import checkpoint_curve, validation_goals, validation_split  # noqa: E402
from bench.records import RESULTS, Baseline, read_records, write_record  # noqa: E402
from flows.stages.timings import read_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "context": "metaworld_{skill}.yaml",
    "maml": "metaworld_{skill}_maml.yaml",
    "macaw": "metaworld_{skill}_macaw.yaml",
    # Offline RL: the context learner with a value function (push only).
    "context-rl": "metaworld_{skill}_rl.yaml",
}
LABELS = {
    "context": "context encoder",
    "maml": "MAML cloning",
    "macaw": "MACAW",
    "context-rl": "context encoder + value (AWR)",
}
DEFAULT_ALGORITHMS = ("context", "maml", "macaw")
"""The algorithms a bench run without --algorithms trains."""
SKILLS = ("reach", "push", "pick-place")
"""The skills, in the order the results table lists them."""
DEFAULT_SKILLS = ("reach", "push")
"""Those a bench run without --skills trains (pick-place has the context config only)."""
CONTEXT_TARGETS = {"push": ">= 0.6"}
"""The adapted success (any step) the context learner's summary is held to, per skill other
than reach (whose three targets are in ``_record_summary``); a skill not named has none."""
POLICIES = ("unadapted", "adapted", "expert")
CURVE_KEYS = tuple(
    f"{figure}_{policy}"
    for figure in ("success", "success_final", "return")
    for policy in ("unadapted", "adapted")
)
_TOOK = re.compile(r"^took .*$", re.MULTILINE)
_RATE = re.compile(r"iteration (\d+)/(\d+) \([^)]*\) \| ([0-9.]+) it/s")


def ensure_data(data: Path, skills: list[str], recording: str = "a") -> float:
    """Record the full sets of ``recording`` that are missing (bench/metaworld_published.py
    ``RECORDINGS``) and refuse those recorded otherwise; returns the seconds recording took
    (0 when none)."""
    missing = [s for s in skills if not (data / s / "heldout" / "dataset.json").is_file()]
    start = time.perf_counter()
    if missing:
        print(f"recording (in {recording}) the full ML1 sets {missing} into {data} (minutes)")
        script = ROOT / "data" / "samples" / "regenerate_metaworld.sh"
        flag = RECORDINGS[recording].flag
        subprocess.run([str(script), flag, str(data), *missing], check=True)
    for skill in skills:
        check_recording(data, skill, recording)
    return time.perf_counter() - start if missing else 0.0


def behaviour_stats(heldout: Path, where: EpisodeFilter | None = None) -> dict[str, Any]:
    """Success (any step, last step), return and count of the held-out data's episodes (those
    ``where`` keeps; the conditions kept under ``where`` in the result)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    columns = ["eps_id", "t", "rewards", "success", "truncateds"]
    table = pa.concat_tables(
        pq.read_table(path, columns=columns) for path in sorted(heldout.glob("*.parquet"))
    )
    conditions = None
    if where is not None:
        from pipeline.reads.episodes import inspect_episodes

        selection = inspect_episodes(heldout, episodes_where=where, check_values="off").selection
        assert selection is not None
        table = selection.keep(table)
        conditions = selection.summary()["where"]
    episodes = table.column("eps_id").to_numpy()
    order = np.lexsort((table.column("t").to_numpy(), episodes))
    episodes, success = episodes[order], table.column("success").to_numpy()[order]
    rewards = table.column("rewards").to_numpy()[order].astype(np.float64)
    starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]])
    ends = np.r_[starts[1:], len(episodes)] - 1
    assert pc.all(table.column("truncateds").take(order[ends])).as_py()
    return {
        "success": float(np.maximum.reduceat(success.astype(np.int8), starts).mean()),
        "success_final": float(success[ends].mean()),
        "return": float(np.add.reduceat(rewards, starts).mean()),
        "episodes": len(starts),
        **({"where": conditions} if conditions is not None else {}),
    }


def run_one(
    skill: str,
    algorithm: str,
    seed: int,
    data: Path,
    work: Path,
    iterations: int | None,
    *,
    extra: dict[str, Any] | None = None,
    tag: str = "",
    recording: str = "a",
) -> dict[str, Any]:
    """One ``offmeta run`` (resumed when ``work`` holds an unfinished one); returns its
    published metrics, wall time, stage line, training rate and the machine's load, with
    ``runs`` (its checkpoints) and ``overrides`` (its ``--set`` values)."""
    config = config_path(skill, algorithm)
    out = work / f"{skill}-{algorithm}{tag}{'' if recording == 'a' else '-' + recording}-seed{seed}"
    overrides: dict[str, Any] = {
        "data.train": data / skill / "train",
        "data.heldout": data / skill / "heldout",
        "training.seed": seed,
        "tasks.seed": seed,
        "training.checkpoint_dir": out / "runs",
        "artifacts.root": out / "artifacts",
        **(extra or {}),
    }
    if iterations is not None:
        overrides["training.iterations"] = iterations
    settings = [f"{key}={value}" for key, value in overrides.items()]
    argv = [str(ROOT / ".venv" / "bin" / "offmeta"), "run", "--config", str(config)]
    for setting in settings:
        argv += ["--set", setting]
    result = out / "result.json"
    if result.is_file():  # finished before: the bench itself resumes
        return {**json.loads(result.read_text()), "runs": out / "runs", "overrides": settings}
    load_before = os.getloadavg()[0]
    out.mkdir(parents=True, exist_ok=True)
    # offmeta run starts its Ray again when Ray's fixed 30 s start wait runs out on a busy
    # machine (flows/process/ray_start.py), so one call is enough.
    unfinished = [r for r in (out / "runs").glob("*/run.json") if not _finished(r.parent)]
    resume = ["--resume"] if unfinished else []
    start = time.perf_counter()
    print(
        f"  {out.name}: offmeta run{' --resume' if resume else ''} started "
        f"{time.strftime('%H:%M:%S')} at load {load_before:.1f}; progress in "
        f"{out.with_suffix('.log')}",
        flush=True,
    )
    with open(out.with_suffix(".log"), "a") as log:
        done = subprocess.run(
            argv + resume, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=_env()
        )
    wall = time.perf_counter() - start
    text = out.with_suffix(".log").read_text()
    if done.returncode != 0:
        raise SystemExit(
            f"{' '.join(argv)} failed (log {out.with_suffix('.log')}):\n{text[-3000:]}"
        )
    from pipeline.artifacts import ArtifactStore

    store = ArtifactStore(out / "artifacts")
    name = f"metaworld-{skill}-{algorithm}"
    manifest = store.get(name)
    took = _TOOK.findall(text)
    rates = _RATE.findall(text)
    run = {
        "metrics": dict(manifest.metrics),
        "wall_s": wall,
        "resumed": bool(resume),
        "stages": took[-1] if took else None,
        "iterations": int(rates[-1][1]) if rates else iterations,
        "iterations_per_s": float(rates[-1][2]) if rates else math.nan,
        "load_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "artifact": str(out / "artifacts"),
        "argv": argv,
    }
    result.write_text(json.dumps(run, indent=2) + "\n")
    return {**run, "runs": out / "runs", "overrides": settings}


def config_path(skill: str, algorithm: str) -> Path:
    """The shipped config of ``skill`` and ``algorithm`` (``pick-place``:
    ``metaworld_pick_place*.yaml``)."""
    return ROOT / "flows" / "configs" / CONFIGS[algorithm].format(skill=skill.replace("-", "_"))


def _finished(run_dir: Path) -> bool:
    return (run_dir / "finished.json").is_file()


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("PYTHONWARNINGS", "ignore::UserWarning")
    return env


def mean_and_error(values: list[float]) -> tuple[float, float]:
    array = np.asarray(values, dtype=np.float64)
    error = float(array.std(ddof=1) / math.sqrt(len(array))) if len(array) > 1 else 0.0
    return float(array.mean()), error


def _figures(metrics: dict[str, float]) -> dict[str, float]:
    figures = {}
    for policy in POLICIES:
        figures[f"success_{policy}"] = metrics.get(f"heldout_success_{policy}", math.nan)
        figures[f"success_final_{policy}"] = metrics.get(
            f"heldout_success_final_{policy}", math.nan
        )
        figures[f"return_{policy}"] = metrics.get(f"heldout_return_{policy}", math.nan)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skills", nargs="+", default=list(DEFAULT_SKILLS), choices=SKILLS)
    parser.add_argument(
        "--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS), choices=list(CONFIGS)
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=None, help="override the configs'")
    parser.add_argument("--data", type=Path, default=ROOT / "bench" / "data" / "metaworld")
    parser.add_argument("--work", type=Path, default=ROOT / "bench" / "data" / "metaworld-runs")
    parser.add_argument(
        "--validation-goals",
        type=int,
        default=0,
        help="N > 0: train without the last N train goals and evaluate on them (the "
        "validation split settings are chosen on), with a learning curve",
    )
    parser.add_argument(
        "--curve-every", type=int, default=1000, help="iterations between curve points"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override under trial (validation runs; named by --tag in the records)",
    )
    parser.add_argument(
        "--no-curve",
        action="store_true",
        help="validation runs: record the final evaluation only (the run's own), no curve",
    )
    parser.add_argument("--tag", default="", help="names the trial's records and folders")
    parser.add_argument(
        "--note", default="", help="what else the trial's run differed in (its records say it)"
    )
    parser.add_argument(
        "--recording",
        default="a",
        choices=list(RECORDINGS),
        help="which full recording --data holds (checked against its dataset.json; recorded "
        "when missing): a, mixed behaviours (the default); b, the published protocol "
        "(regenerate_metaworld.sh --full-published); the records and tables name it",
    )
    parser.add_argument(
        "--online",
        action="store_true",
        help="after each run, evaluate its final checkpoint again with context collected "
        "online (" + ", ".join(f"{k}={v}" for k, v in ONLINE_DEFAULTS.items()) + "), recorded "
        "beside the run's own offline-context figures",
    )
    parser.add_argument(
        "--online-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an evaluation setting of the online evaluation over its defaults (implies "
        "--online); a new setting reevaluates finished runs, without training again",
    )
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument(
        "--summary-only",
        action="store_true",
        help="record the summary over --seeds only (runs done before, e.g. one seed per process "
        "side by side, each of which recorded its run)",
    )
    args = parser.parse_args()
    missing = [
        str(config_path(skill, algorithm).relative_to(ROOT))
        for skill in args.skills
        for algorithm in args.algorithms
        if not config_path(skill, algorithm).is_file()
    ]
    if missing:
        parser.error(
            f"no shipped config {', '.join(missing)}: leave that skill or algorithm out "
            "(pick-place has the context learner's only: --algorithms context)"
        )
    record = not args.no_record
    recording_s = ensure_data(args.data, args.skills, args.recording)
    trial = dict(override.split("=", 1) for override in args.overrides)
    online = (
        {**ONLINE_DEFAULTS, **dict(s.split("=", 1) for s in args.online_set)}
        if args.online or args.online_set
        else None
    )
    tag = f"-{args.tag}" if args.tag else ""
    for skill in args.skills:
        if args.validation_goals:
            for algorithm in args.algorithms:
                for seed in args.seeds:
                    _validate(skill, algorithm, seed, trial, tag, args, record)
            continue
        behaviour = behaviour_stats(args.data / skill / "heldout")
        print(
            f"{skill}: behaviour data success {behaviour['success']:.2f} (any step), "
            f"{behaviour['success_final']:.2f} (last step), return {behaviour['return']:.1f}"
        )
        results: dict[str, list[dict[str, float]]] = {}
        datasets: dict[str, dict[str, Any]] = {}
        for algorithm in args.algorithms:
            dataset = datasets[algorithm] = _dataset_stats(skill, algorithm, args.data, trial)
            print(
                f"{skill} {algorithm}: dataset mean return {dataset['return']:.1f} over the "
                f"{dataset['episodes']} held-out episodes the config keeps (normalises returns)"
            )
            for seed in args.seeds:
                run = run_one(
                    skill,
                    algorithm,
                    seed,
                    args.data,
                    args.work,
                    args.iterations,
                    extra=trial,
                    recording=args.recording,
                )
                figures = _figures(run["metrics"])
                figures |= normalised(figures, dataset["return"])
                print(
                    f"  {algorithm} seed {seed}: adapted success {figures['success_adapted']:.2f}"
                    f" / final {figures['success_final_adapted']:.2f}, return "
                    f"{figures['return_adapted']:.1f} (normalised "
                    f"{figures['normalised_adapted']:.2f}; unadapted "
                    f"{figures['success_unadapted']:.2f}, expert {figures['success_expert']:.2f})"
                    f"; {run['wall_s']:.0f} s, {run['iterations_per_s']:.1f} it/s",
                    flush=True,
                )
                evaluated = None
                if online is not None:
                    evaluated = evaluate_online(
                        config_path(skill, algorithm), algorithm, seed, run, online, dataset
                    )
                    figures |= {
                        f"online_{key}": evaluated[key]
                        for key in (*CURVE_KEYS, "normalised_unadapted", "normalised_adapted")
                    }
                results.setdefault(algorithm, []).append(figures)
                if record and not args.summary_only:
                    _record_run(
                        skill,
                        algorithm,
                        seed,
                        figures,
                        run,
                        {"behaviour": behaviour, "dataset": dataset, "online": evaluated},
                        args,
                        recording_s,
                    )
        if record and len(args.seeds) > 1:  # one seed per process: --summary-only after
            if args.recording == "a":
                _record_summary(skill, results, behaviour, args)
            else:
                shapes = {a: _shape(skill, a, args) for a in results}
                record_summary(skill, args.recording, results, datasets, online, shapes, args.seeds)


def _dataset_stats(skill: str, algorithm: str, data: Path, trial: dict[str, str]) -> dict[str, Any]:
    """``behaviour_stats`` of the held-out episodes the config's
    ``data.episodes_where.heldout`` (with the trial's overrides) keeps: what returns are
    normalised by."""
    from flows.config import load_config
    from flows.stages.datasets import episode_filter

    cfg = load_config(config_path(skill, algorithm), [f"{k}={v}" for k, v in trial.items()])
    return behaviour_stats(data / skill / "heldout", episode_filter(cfg, "heldout"))


def _validate(
    skill: str,
    algorithm: str,
    seed: int,
    trial: dict[str, str],
    tag: str,
    args: argparse.Namespace,
    record: bool,
) -> None:
    """One validation run of ``trial`` and its learning curve on the validation goals."""
    from flows.config import load_config

    config = config_path(skill, algorithm)
    train = args.data / skill / "train"
    where = args.data / skill / f"validation-{args.validation_goals}"
    split = validation_split(train, args.validation_goals, where)
    split = {"data.train": split["train"], "data.heldout": split["heldout"]}
    keep = {
        "training.checkpoint_every": args.curve_every,
        "training.keep_checkpoints": 1000,
    }
    extra = {**split, **keep, **trial}
    run = run_one(
        skill,
        algorithm,
        seed,
        args.data,
        args.work,
        args.iterations,
        extra=extra,
        tag=f"-validation{tag}",
    )
    overrides = [f"{key}={value}" for key, value in extra.items()]
    overrides += [f"training.seed={seed}", f"tasks.seed={seed}"]
    cfg = load_config(config, overrides)
    saved = run["runs"].parent / "curve.json"
    if saved.is_file():
        curve = json.loads(saved.read_text())
    elif args.no_curve:
        figures = _figures(run["metrics"])
        curve = [{"iteration": run["iterations"], **{k: figures[k] for k in CURVE_KEYS}}]
    else:
        curve = checkpoint_curve(cfg, run["runs"])
        saved.write_text(json.dumps(curve, indent=2) + "\n")
    final = curve[-1]
    print(
        f"  validation {algorithm}{tag} seed {seed}: adapted success "
        f"{final['success_adapted']:.2f} / final {final['success_final_adapted']:.2f} "
        f"(unadapted {final['success_unadapted']:.2f}); {run['wall_s']:.0f} s, "
        f"{run['iterations_per_s']:.1f} it/s; curve "
        + ", ".join(f"{p['iteration']}: {p['success_adapted']:.2f}" for p in curve),
        flush=True,
    )
    if not record:
        return
    write_record(
        "metaworld",
        f"validation-{skill}-{algorithm}{tag}-seed{seed}",
        f"Meta-World ML1 {skill}-v3, {algorithm}, seed {seed}, validation split: success (any "
        f"step) of the adapted policy on the last {args.validation_goals} train goals, held "
        "aside from training; the learning curve evaluates every checkpoint on them",
        final["success_adapted"],
        "success rate",
        shape={**_shape(skill, algorithm, args), "seed": seed, "trial": trial, "note": args.note},
        details={
            "validation_goals": validation_goals(train, args.validation_goals),
            "curve": curve,
            **_timing(run),
        },
    )


def _timing(run: dict[str, Any]) -> dict[str, Any]:
    """A run's wall time, stages, training rate and load, for its record."""
    return {
        "wall_s": round(run["wall_s"], 1),
        "resumed": run.get("resumed", False),
        "stages": run["stages"],
        "train_s": stage_seconds(run["stages"], "train"),
        "iterations": run["iterations"],
        "iterations_per_s": run["iterations_per_s"],
        "load_1min": run["load_1min"],
        "device": "cpu",
    }


def _shape(skill: str, algorithm: str, args: argparse.Namespace) -> dict[str, Any]:
    from flows.config import load_config

    cfg = load_config(config_path(skill, algorithm))
    metadata = json.loads((args.data / skill / "train" / "dataset.json").read_text())
    generator = metadata["generator"]["args"]
    # Recording (a)'s records predate the label: its shape stays as they wrote it.
    return {
        **({"recording": args.recording} if args.recording != "a" else {}),
        "skill": f"{skill}-v3",
        "algorithm": algorithm,
        "iterations": args.iterations or cfg.training.iterations,
        "train_goals": generator["train_goals"],
        "heldout_goals": generator["heldout_goals"],
        "episodes_per_goal": generator["episodes_per_goal"],
        "support": cfg.tasks.support
        if cfg.tasks.support_from == "transitions"
        else f"{cfg.tasks.support_episodes} episode(s) x {cfg.tasks.support_window or 'all'} steps",
        "query": cfg.tasks.query,
        "meta_batch": cfg.tasks.meta_batch,
        **(
            {"encoder_inputs": "standardised" if context.standardize_transitions else "raw"}
            if (context := cfg.learners.context) is not None
            else {}
        ),
        # Settings later configs added: absent from the records of configs without them.
        **(
            {"ignored_obs_features": len(cfg.data.ignore_obs_features)}
            if cfg.data.ignore_obs_features
            else {}
        ),
        **(
            {"shift_obs": f"{len(shift.features)} x {len(shift.features[0])}, {shift.scale:g}"}
            if (shift := cfg.tasks.shift_obs) is not None
            else {}
        ),
        **(
            {"heldout_context": "whole episodes" if window == "whole" else f"{window} steps"}
            if (window := cfg.evaluation.context_window) is not None
            else {}
        ),
        **_online_explore(cfg.evaluation),
    }


def _online_explore(evaluation: EvaluationConfig) -> dict[str, str]:
    """How the config explores with online context, when not with the unadapted policy."""
    if evaluation.context_explore == "prior":
        return {}
    step = evaluation.context_refine_step if evaluation.context_explore == "refine" else None
    return {"online_explore": evaluation.context_explore + (f", step {step:g}" if step else "")}


def _record_run(
    skill: str,
    algorithm: str,
    seed: int,
    figures: dict[str, float],
    run: dict[str, Any],
    data: dict[str, Any],
    args: argparse.Namespace,
    recording_s: float,
) -> None:
    """One run's record; ``data``: ``behaviour`` (every held-out episode), ``dataset`` (those
    the config keeps, what returns are normalised by) and ``online`` (the online-context
    evaluation, or None)."""
    details = {
        **{k: v for k, v in figures.items() if not k.startswith("online_")},
        "behaviour": data["behaviour"],
        "dataset": data["dataset"],
        **({"online": data["online"]} if data["online"] is not None else {}),
        **_timing(run),
        "recording_s": round(recording_s, 1),
    }
    shape = {**_shape(skill, algorithm, args), "seed": seed}
    if args.recording == "a":
        write_record(
            "metaworld",
            f"run-{skill}-{algorithm}-seed{seed}",
            f"Meta-World ML1 {skill}-v3, {algorithm}, seed {seed}: held-out success (any step) "
            "of the policy adapted on each goal's support transitions; baseline: the scripted "
            "expert given the goal, same goals",
            figures["success_adapted"],
            "success rate",
            shape=shape,
            baseline=Baseline("scripted expert, held-out success", figures["success_expert"])
            if figures["success_expert"] > 0
            else None,
            details=details,
        )
        return
    write_record(
        "metaworld",
        f"run-{args.recording}-{skill}-{algorithm}-seed{seed}",
        f"Meta-World ML1 {skill}-v3, recording ({args.recording}), {algorithm}, seed {seed}: "
        "held-out return of the policy adapted on each goal's recorded context over the "
        "held-out episodes' mean return (the normalised return); details.online: the same "
        "parameters with context collected online",
        figures["normalised_adapted"],
        "normalised return",
        shape=shape,
        details=details,
    )


def _record_summary(
    skill: str,
    results: dict[str, list[dict[str, float]]],
    behaviour: dict[str, float],
    args: argparse.Namespace,
) -> None:
    summary = {
        algorithm: {key: mean_and_error([r[key] for r in runs]) for key in runs[0]}
        for algorithm, runs in results.items()
    }
    details = {"seeds": args.seeds, "behaviour": behaviour, "by_algorithm": summary}
    if "context-rl" in summary:
        _record_offline_rl(skill, summary, details, args)
    if skill == "reach":
        for algorithm, figures in summary.items():
            gain = mean_and_error(
                [r["success_adapted"] - r["success_unadapted"] for r in results[algorithm]]
            )
            targets = (
                (
                    "",
                    "held-out success (any step) after adaptation",
                    figures["success_adapted"],
                    ">= 0.9",
                ),
                (
                    "-final",
                    "held-out success at the episode's last step after adaptation",
                    figures["success_final_adapted"],
                    ">= 0.7",
                ),
                (
                    "-gain",
                    "held-out success (any step) adapted minus unadapted (the goal is "
                    "hidden: adaptation must find it)",
                    gain,
                    ">= 0.3",
                ),
            )
            for suffix, what, (mean, error), target in targets:
                print(f"{skill} {algorithm}: {what} {mean:.2f} ± {error:.2f} ({target})")
                write_record(
                    "metaworld",
                    f"summary-{skill}-{algorithm}{suffix}",
                    f"Meta-World ML1 {skill}-v3, {algorithm}: {what}, mean over seeds",
                    mean,
                    "success rate",
                    shape={**_shape(skill, algorithm, args), "seeds": len(args.seeds)},
                    target=target,
                    details={**details, "standard_error": error},
                )
        return
    if set(summary) == {"context"}:
        mean, error = summary["context"]["success_adapted"]
        target = CONTEXT_TARGETS.get(skill)
        shown = target or "no target"
        print(f"{skill} context: adapted success {mean:.2f} ± {error:.2f} ({shown})")
        write_record(
            "metaworld",
            f"summary-{skill}-context",
            f"Meta-World ML1 {skill}-v3, context: held-out success (any step) after adaptation, "
            "mean over seeds",
            mean,
            "success rate",
            shape={**_shape(skill, "context", args), "seeds": len(args.seeds)},
            target=target,
            details={**details, "standard_error": error},
        )
        return
    if not {"maml", "macaw"} <= set(summary):
        return
    (macaw, macaw_se), (maml, maml_se) = (
        summary["macaw"]["success_adapted"],
        summary["maml"]["success_adapted"],
    )
    joint = math.hypot(macaw_se, maml_se)
    lead = (macaw - maml) / joint if joint > 0 else (math.inf if macaw > maml else 0.0)
    print(
        f"{skill}: MACAW {macaw:.2f} ± {macaw_se:.2f}, MAML {maml:.2f} ± {maml_se:.2f}: "
        f"{lead:.1f} s.e."
    )
    write_record(
        "metaworld",
        f"summary-{skill}-macaw-vs-maml",
        f"Meta-World ML1 {skill}-v3: MACAW's held-out success (any step) after adaptation, "
        "mean over seeds; baseline: MAML behaviour cloning's; ratio: MACAW's lead in standard "
        "errors of the difference of the means",
        macaw,
        "success rate",
        shape={**_shape(skill, "macaw", args), "seeds": len(args.seeds)},
        baseline=Baseline("MAML behaviour cloning, held-out success (mean of seeds)", maml),
        ratio=lead if math.isfinite(lead) else 1e9,
        target=">= 2",
        details=details,
    )


def _record_offline_rl(
    skill: str,
    summary: dict[str, dict[str, tuple[float, float]]],
    details: dict[str, Any],
    args: argparse.Namespace,
    directory: Path = RESULTS,
) -> None:
    """Offline RL against cloning on return: the adapted held-out return of the context
    learner with its value function over seeds; baseline the cloning context learner's, from
    this call's runs (``--algorithms context context-rl``) or else from the newest
    ``summary-<skill>-context`` record (named in ``details.baseline_from``); ratio >= 1:
    offline RL at least as good. ``details.lead_se``: the difference of the means in
    standard errors of the difference. Records are read from and written to ``directory``."""
    rl, rl_se = summary["context-rl"]["return_adapted"]
    if "context" in summary:
        (cloning, cloning_se), source = summary["context"]["return_adapted"], "this call's runs"
    else:
        earlier = [r for r in read_records(directory) if r["figure"] == f"summary-{skill}-context"]
        if not earlier:
            print(f"{skill}: no cloning summary to compare with: add --algorithms context")
            return
        newest = max(earlier, key=lambda r: r["date"])
        cloning, cloning_se = newest["details"]["by_algorithm"]["context"]["return_adapted"]
        source = (
            f"record summary-{skill}-context of {newest['date']} at "
            f"{(newest['git']['revision'] or 'no git')[:10]}"
        )
    joint = math.hypot(rl_se, cloning_se)
    lead = (rl - cloning) / joint if joint > 0 else 0.0
    print(
        f"{skill}: adapted return, offline RL {rl:.0f} ± {rl_se:.0f}, cloning "
        f"{cloning:.0f} ± {cloning_se:.0f} ({source}): {lead:+.1f} s.e."
    )
    write_record(
        "metaworld",
        f"summary-{skill}-context-rl-vs-context",
        f"Meta-World ML1 {skill}-v3: the context learner with a value function (advantage-"
        "weighted regression)'s held-out return after adaptation, mean over seeds; baseline: "
        "the cloning context learner's (details.baseline_from); ratio: offline RL over cloning",
        rl,
        "return",
        shape={**_shape(skill, "context-rl", args), "seeds": len(args.seeds)},
        baseline=Baseline("context learner cloning, held-out return (mean of seeds)", cloning),
        target=">= 1",
        details={
            **details,
            "standard_error": rl_se,
            "baseline_standard_error": cloning_se,
            "baseline_from": source,
            "lead_se": lead,
        },
        directory=directory,
    )


def stage_seconds(took: str | None, stage: str) -> float:
    """Seconds of ``stage`` in a run's ``took ...`` line (nan when the line lacks it)."""
    return (read_line(took or "") or {}).get(stage, math.nan)


if __name__ == "__main__":
    main()
