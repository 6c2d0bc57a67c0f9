"""docs/metaworld.md's tables from bench/metaworld.py's records: the results of recording (a)
(``render_results``: per skill, the behaviour data, the expert and each algorithm unadapted and
adapted, over the latest run of each seed of the newest shape) and the validation trials'
learning curves (``render_validation``). ``bench/readme_table.py`` writes them into the page;
recording (b)'s table is ``bench/metaworld_published.render_published``."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from bench.metaworld import LABELS, SKILLS, mean_and_error, stage_seconds

PUBLISHED = (
    "Published offline meta-RL figures on ML1 are normalised returns, not success rates, so "
    "none sits in a column above. The nearest: on push, MACAW 0.28 ± 0.19 of the dataset's "
    "return (CTMRL's README, github.com/hehongc/CTMRL, which reports IDAQ 0.55 ± 0.10 and "
    "FOCAL 0.34 ± 0.14 beside it), and over all 50 ML1 skills MACAW 0.18 ± 0.09 with online "
    "adaptation, 0.68 ± 0.07 given the test task's offline context (GCC, ICLR 2023 "
    "submission, Table 1, returns normalised by an expert's). Their protocol differs: v2 "
    "skills, data from SAC runs or scripted experts with 45 trajectories per goal kept by "
    "success, online few-shot adaptation episodes; here v3 skills, 12 recorded episodes per "
    "goal of mixed quality, adaptation on K offline support transitions of the held-out goal "
    "(the given-context setting). Recording (b) follows their data protocol and reports "
    "normalised returns ([its table](#results-b))."
)


def render_results(records: list[dict[str, Any]]) -> str:
    """docs/metaworld.md's results table from the ``run-*`` records: per skill and algorithm,
    the latest run of each seed with the shape of the newest one."""
    runs = [
        r
        for r in records
        if r["bench"] == "metaworld"
        and r["figure"].startswith("run-")
        and r["shape"].get("recording", "a") == "a"
    ]
    if not runs:
        return "No records yet: run `bench/metaworld.py`."
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for record in sorted(runs, key=lambda r: r["date"]):
        latest[(record["shape"]["skill"], record["shape"]["algorithm"])] = record
    lines = [
        "| skill | policy | success, any step | success, last step | return | seeds | "
        "wall per run (stages) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    shapes: list[tuple[str, str, list[dict[str, Any]]]] = []
    for skill in sorted({skill for skill, _ in latest}, key=_skill_order):
        chosen = {
            algorithm: _same_shape(runs, newest)
            for (s, algorithm), newest in sorted(latest.items())
            if s == skill
        }
        any_runs = next(iter(chosen.values()))
        behaviour = any_runs[0]["details"]["behaviour"]
        lines.append(
            f"| {skill} | behaviour data (held-out goals) | {behaviour['success']:.2f} | "
            f"{behaviour['success_final']:.2f} | {behaviour['return']:.0f} | | |"
        )
        lines.append(_row(skill, "scripted expert", any_runs, "expert", wall=False))
        for algorithm, chosen_runs in chosen.items():
            label = LABELS[algorithm]
            shapes.append((skill, label, chosen_runs))
            lines.append(_row(skill, f"{label}, unadapted", chosen_runs, "unadapted", wall=False))
            lines.append(_row(skill, f"{label}, adapted", chosen_runs, "adapted", wall=True))
    shape = any_runs[0]["shape"]
    newest = max(runs, key=lambda r: r["date"])
    return "\n".join(
        [
            *lines,
            "",
            f"Mean ± standard error over seeds; {shape['heldout_goals']} held-out goals, one "
            f"500-step episode each; {shape['train_goals']} train goals, "
            f"{shape['episodes_per_goal']} episodes each. Machine: "
            f"{newest['machine']['cpu']}, {newest['machine']['cores']} cores, no GPU. The wall "
            "column: the whole `offmeta run`, its train and evaluate stages, the training rate "
            "(iterations/s, compilation included) and the 1-minute load at the run's start.",
            "",
            *(f"- {_shape_line(skill, label, chosen)}" for skill, label, chosen in shapes),
            "",
            PUBLISHED,
            "",
            "Learning curves on the validation split (the settings were chosen on these; "
            "never on the held-out goals):",
            "",
            render_validation(records),
        ]
    )


def _skill_order(skill: str) -> int:
    """Where ``skill`` (``reach-v3``) sits in the results table: ``SKILLS``' order."""
    return SKILLS.index(skill.removesuffix("-v3"))


def _shape_line(skill: str, label: str, runs: list[dict[str, Any]]) -> str:
    """What one (skill, algorithm) row group was trained on, and when."""
    shape, newest = runs[-1]["shape"], max(runs, key=lambda r: r["date"])
    support = shape["support"]
    support = f"K={support} support transitions" if isinstance(support, int) else support
    heldout = shape.get("heldout_context")
    support += f" of context in training ({heldout} held out)" if heldout else " of context"
    return (
        f"{skill}, {label}: {support}, Q={shape['query']} query transitions, "
        f"{shape['meta_batch']} tasks per meta-batch, {shape['iterations']} meta-iterations; "
        f"seeds {', '.join(str(r['shape']['seed']) for r in runs)}, records of "
        f"{newest['date'][:10]} at {newest['git']['revision'][:10]}."
    )


def render_validation(records: list[dict[str, Any]]) -> str:
    """The learning curves of the ``validation-*`` records: adapted success on the train
    goals held aside, by iteration (unadapted in brackets), one row per trial and seed."""
    runs = [r for r in records if r["bench"] == "metaworld" and r["figure"].startswith("valid")]
    if not runs:
        return "No validation records yet: run `bench/metaworld.py --validation-goals N`."
    lines = [
        "| skill | algorithm | trial | seed | adapted (unadapted) success by iteration | "
        "final, last step | it/s | wall |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for record in sorted(runs, key=lambda r: r["date"]):
        shape, details = record["shape"], record["details"]
        trial = ", ".join(f"`{k}={v}`" for k, v in shape.get("trial", {}).items())
        trial = "; ".join(part for part in (trial, shape.get("note")) if part) or "as shipped"
        trial += f" (at {(record['git']['revision'] or 'no git')[:7]})"
        if shape.get("recording", "a") != "a":
            trial += f", recording ({shape['recording']})"
        curve = "; ".join(
            f"{p['iteration']}: {p['success_adapted']:.2f} ({p['success_unadapted']:.2f})"
            for p in details["curve"]
        )
        last = details["curve"][-1]
        lines.append(
            f"| {shape['skill']} | {LABELS.get(shape['algorithm'], shape['algorithm'])} | "
            f"{trial} | {shape['seed']} | {curve} | {last['success_final_adapted']:.2f} | "
            f"{details['iterations_per_s']:.1f} | {details['wall_s']:.0f} s (load "
            f"{record['machine']['load_average_1m']:.0f}) |"
        )
    held: dict[str, set[int]] = {}  # goals held aside, per skill in the table's order
    for record in sorted(runs, key=lambda r: r["date"]):
        held.setdefault(record["shape"]["skill"], set()).add(
            len(record["details"]["validation_goals"])
        )
    counts = set().union(*held.values())
    goals = (
        f"{counts.pop()} (in task-id order)"
        if len(counts) == 1
        else "few in task-id order ("
        + ", ".join(f"{skill}: {' or '.join(map(str, sorted(n)))}" for skill, n in held.items())
        + ")"
    )
    return "\n".join(
        [
            *lines,
            "",
            f"Each run trains on the train goals but the last {goals} and evaluates every kept "
            "checkpoint on those (a curve of one point: the final one alone), with the config's "
            "context and rollouts.",
        ]
    )


def _same_shape(runs: list[dict[str, Any]], newest: dict[str, Any]) -> list[dict[str, Any]]:
    """The latest record of each seed whose shape, seed aside, is the newest record's."""

    def key(record: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in record["shape"].items() if k != "seed"}, sort_keys=True)

    by_seed: dict[int, dict[str, Any]] = {}
    for record in sorted(runs, key=lambda r: r["date"]):
        if key(record) == key(newest):
            by_seed[record["shape"]["seed"]] = record
    return [by_seed[seed] for seed in sorted(by_seed)]


def _row(skill: str, label: str, runs: list[dict[str, Any]], policy: str, *, wall: bool) -> str:
    cells = [skill, label]
    for key in (f"success_{policy}", f"success_final_{policy}", f"return_{policy}"):
        mean, error = mean_and_error([r["details"][key] for r in runs])
        digits = ".0f" if key.startswith("return") else ".2f"
        cells.append(f"{mean:{digits}} ± {error:{digits}}")
    cells.append(str(len(runs)))
    if wall:
        seconds = {
            stage: np.mean([stage_seconds(r["details"]["stages"], stage) for r in runs])
            for stage in ("train", "evaluate")
        }
        total = np.mean([r["details"]["wall_s"] for r in runs])
        cell = f"{total:.0f} s (train {seconds['train']:.0f}, evaluate {seconds['evaluate']:.0f})"
        rates = [r["details"].get("iterations_per_s") for r in runs]
        if all(rate is not None for rate in rates):
            loads = [r["details"]["load_1min"][0] for r in runs]
            cell += f", {np.mean(rates):.1f} it/s, load {min(loads):.0f}-{max(loads):.0f}"
        cells.append(cell)
    else:
        cells.append("")
    return "| " + " | ".join(cells) + " |"
