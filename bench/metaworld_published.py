"""Recording (b) of bench/metaworld.py: the published offline ML1 protocol and its figures.

The published offline meta-RL tables on Meta-World ML1 (IDAQ, CTMRL, GENTLE) train on the
scripted expert at N(0, 0.1) action noise, 45 episodes of 500 steps per goal, and report the
**normalised return**: a held-out goal's test return divided by the dataset's mean episode
return. Their context is collected online: the policy explores the held-out goal first.

- ``RECORDINGS``: what each ``--recording`` label means, the ``regenerate_metaworld.sh`` flag
  that records it, and ``check_recording`` refusing data recorded otherwise;
- ``normalised``: returns over the held-out goals' dataset mean episode return (the episodes
  the config's ``data.episodes_where.heldout`` keeps, bench/metaworld.py ``behaviour_stats``);
- ``online_figures``: a finished run's final checkpoint evaluated again with the context
  collected online (``evaluation.context: online``, docs/episodes.md#online-context), the same
  trained parameters as the run's own offline-context figures, cached beside the run;
- ``render_published``: docs/metaworld.md's recording (b) table, the published figures beside.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from bench.metaworld_validation import checkpoint_curve

if TYPE_CHECKING:
    from flows.config import MetaTrainConfig


class Recording(NamedTuple):
    """One full recording of bench/metaworld.py's data."""

    flag: str
    """``data/samples/regenerate_metaworld.sh``'s flag that records it."""
    generator: dict[str, Any]
    """The recorder's arguments (``dataset.json`` ``generator.args``) that make it."""
    description: str


RECORDINGS = {
    "a": Recording(
        "--full",
        {"noise": [0.1, 0.5, 1.0], "random_policy": True, "episodes_per_goal": 12},
        "mixed behaviours: the scripted expert at action noise 0.1, 0.5 and 1.0 and a uniform "
        "random policy, 12 episodes of 500 steps per goal",
    ),
    "b": Recording(
        "--full-published",
        {"noise": [0.1], "random_policy": False, "episodes_per_goal": 45},
        "the published protocol: the scripted expert at N(0, 0.1) action noise, 45 episodes of "
        "500 steps per goal",
    ),
}
ONLINE_DEFAULTS = {"evaluation.context": "online", "evaluation.context_episodes": "5"}
"""The online evaluation of recording (b): 5 exploration episodes per held-out goal."""
TARGETS = {"reach": ">= 0.95", "push": ">= 0.85"}
"""Online-context normalised return (adapted), mean over seeds."""
PUBLISHED = {
    "reach": (("CTMRL", "0.94", "reach-wall-v2"), ("MACAW", "0.82", "reach-wall-v2")),
    "push": (
        ("CTMRL", "0.80", "push-v2"),
        ("GENTLE", "0.82", "push-v2"),
        ("IDAQ", "0.55 ± 0.10", "push-v2"),
        ("MACAW", "0.28 ± 0.19", "push-v2"),
    ),
}
"""Published normalised returns (CTMRL's README table, github.com/hehongc/CTMRL)."""


def check_recording(data: Path, skill: str, recording: str) -> None:
    """Refuse ``data/skill`` when its ``dataset.json`` was not recorded as ``recording``."""
    expected = RECORDINGS[recording]
    for split in ("train", "heldout"):
        described = data / skill / split / "dataset.json"
        found = json.loads(described.read_text())["generator"]["args"]
        differing = {k: found.get(k) for k, v in expected.generator.items() if found.get(k) != v}
        if differing:
            raise SystemExit(
                f"--recording {recording}: {described} was recorded with {differing}, expected "
                f"{ {k: expected.generator[k] for k in differing} } ({expected.description}); "
                f"record it with data/samples/regenerate_metaworld.sh {expected.flag} "
                f"{data} {skill}, or pass the --recording it was made as"
            )


def normalised(figures: Mapping[str, float], dataset_return: float) -> dict[str, float]:
    """Each ``return_<policy>`` of ``figures`` over ``dataset_return``, as
    ``normalised_<policy>``."""
    return {
        f"normalised_{key.removeprefix('return_')}": value / dataset_return
        for key, value in figures.items()
        if key.startswith("return_")
    }


def online_figures(
    config: Path, overrides: list[str], runs: Path, settings: Mapping[str, str]
) -> dict[str, Any]:
    """The final checkpoint under ``runs`` evaluated with ``config``, the run's ``overrides``
    and the online ``settings`` (``evaluation.context=online`` and the rest): figures of the
    unadapted and adapted policy, the evaluation's context line, its wall time and load.
    Cached in ``runs``' parent, one file per settings and evaluation section (the config's
    own, such as its ``context_explore``, count as much as ``settings``): a second call with
    both the same reads it."""
    from flows.config import load_config

    cfg = load_config(config, [*overrides, *(f"{k}={v}" for k, v in settings.items())])
    cache = online_cache(cfg, runs, settings)
    if cache.is_file():
        return json.loads(cache.read_text())
    load, start = os.getloadavg()[0], time.perf_counter()
    (point,) = checkpoint_curve(cfg, runs, final_only=True)
    figures = {
        **point,
        "settings": dict(settings),
        "wall_s": round(time.perf_counter() - start, 1),
        "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)],
    }
    cache.write_text(json.dumps(figures, indent=2) + "\n")
    return figures


def online_cache(cfg: MetaTrainConfig, runs: Path, settings: Mapping[str, str]) -> Path:
    """Where ``online_figures`` keeps the figures of ``runs`` evaluated under ``cfg`` (the
    run's config with the online ``settings``): named by the settings and a digest of the
    whole evaluation section, so that a config whose own evaluation settings changed (its
    ``context_explore``, say) is evaluated again instead of read back."""
    section = json.dumps(cfg.evaluation.model_dump(mode="json"), sort_keys=True)
    digest = hashlib.sha256(section.encode()).hexdigest()[:12]
    return runs.parent / f"online-{_slug(settings)}-{digest}.json"


def evaluate_online(
    config: Path,
    algorithm: str,
    seed: int,
    run: Mapping[str, Any],
    settings: Mapping[str, str],
    dataset: Mapping[str, Any],
) -> dict[str, Any]:
    """``online_figures`` of a finished run (bench/metaworld.py ``run_one``'s ``run``) with
    its returns normalised by ``dataset``'s, and a progress line before and after."""
    shown = ", ".join(f"{k}={v}" for k, v in settings.items())
    print(f"  {algorithm} seed {seed}: online evaluation ({shown}) ...", flush=True)
    evaluated = online_figures(config, run["overrides"], run["runs"], settings)
    evaluated |= normalised(evaluated, dataset["return"])
    print(
        f"  {algorithm} seed {seed}: online context ({evaluated['context']}): adapted success "
        f"{evaluated['success_adapted']:.2f} / final {evaluated['success_final_adapted']:.2f}, "
        f"normalised return {evaluated['normalised_adapted']:.2f}; {evaluated['wall_s']:.0f} s",
        flush=True,
    )
    return evaluated


def record_summary(
    skill: str,
    recording: str,
    results: Mapping[str, list[dict[str, float]]],
    datasets: Mapping[str, dict[str, Any]],
    online: Mapping[str, str] | None,
    shapes: Mapping[str, dict[str, Any]],
    seeds: list[int],
) -> None:
    """Per algorithm, the normalised return of the adapted policy over ``seeds``
    (``results``: one dict of figures per seed, in their order) with offline context (report
    only) and, when evaluated, with online context (``TARGETS``); ``shapes``: each
    algorithm's record shape."""
    from bench.metaworld import mean_and_error  # bench.metaworld imports this module
    from bench.records import write_record

    for algorithm, runs in results.items():
        contexts: list[tuple[str, str, str | None]] = [("offline", "normalised_adapted", None)]
        if online is not None:
            contexts.append(("online", "online_normalised_adapted", TARGETS[skill]))
        extra = {k: v for k, v in (online or {}).items() if ONLINE_DEFAULTS.get(k) != v}
        for context, key, target in contexts:
            # An online protocol other than the defaults is a summary of its own.
            named = context
            if context == "online" and extra:
                named += "-" + re.sub(r"[^a-z0-9_]+", "-", _slug(extra).lower())
            mean, error = mean_and_error([r[key] for r in runs])
            print(
                f"{skill} {algorithm}, recording ({recording}), {named} context: "
                f"normalised return {mean:.2f} ± {error:.2f} ({target or 'report only'})"
            )
            write_record(
                "metaworld",
                f"summary-{recording}-{skill}-{algorithm}-{named}",
                f"Meta-World ML1 {skill}-v3, recording ({recording}), {algorithm}: normalised "
                f"return of the adapted policy, {named} context, mean over seeds",
                mean,
                "normalised return",
                shape={**_context_shape(shapes[algorithm], named), "seeds": len(runs)},
                target=target,
                details={
                    "standard_error": error,
                    "seeds": seeds,
                    "per_seed": [r[key] for r in runs],
                    "dataset": datasets[algorithm],
                    "online_settings": dict(online) if context == "online" else None,
                },
            )


def _context_shape(shape: Mapping[str, Any], context: str) -> dict[str, Any]:
    """A run's shape for a summary of ``context`` (``offline``, ``online``, ``online-...``):
    online exploration episodes are not cut by ``evaluation.context_window``, so
    ``heldout_context`` belongs to the recorded context's summary only, and the config's
    ``online_explore`` to the online ones only."""
    other = "online_explore" if context == "offline" else "heldout_context"
    return {**{k: v for k, v in shape.items() if k != other}, "context": context}


def _slug(settings: Mapping[str, str]) -> str:
    text = ",".join(f"{k.removeprefix('evaluation.')}={v}" for k, v in sorted(settings.items()))
    return re.sub(r"[^A-Za-z0-9.,=_-]+", "_", text)


def render_published(records: list[dict[str, Any]], labels: Mapping[str, str]) -> str:
    """The recording (b) table from the ``run-*`` records of ``shape.recording`` b: per skill
    and algorithm, the latest run of each seed (of the newest training shape), its offline-
    and online-context figures (one online row per online settings recorded), mean ± s.e.;
    ``labels`` names the algorithms."""
    runs = [
        r
        for r in records
        if r["bench"] == "metaworld"
        and r["figure"].startswith("run-")
        and r["shape"].get("recording") == "b"
    ]
    if not runs:
        return (
            "No recording (b) records yet: run `bench/metaworld.py --recording b --online` "
            "(see [Reproduce](#reproduce))."
        )
    lines = [
        "| skill | policy | context | normalised return | success, any step | "
        "success, last step | return | seeds | wall per run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    notes = []
    skills = sorted({r["shape"]["skill"] for r in runs}, key=lambda s: s.startswith("push"))
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in runs:
        groups.setdefault((record["shape"]["skill"], record["shape"]["algorithm"]), []).append(
            record
        )
    for skill in skills:
        for (s, algorithm), group in sorted(groups.items()):
            if s == skill:
                lines += _rows(skill, labels.get(algorithm, algorithm), group, notes)
        for method, figure, where in PUBLISHED[skill.removesuffix("-v3")]:
            lines.append(f"| {where} | {method} (published) | online | {figure} | | | | | |")
    newest = max(runs, key=lambda r: r["date"])
    machine = newest["machine"]
    return "\n".join(
        [
            *lines,
            "",
            "Normalised return: the policy's mean return over the held-out goals (one 500-step "
            "episode each) over the mean return of that recording's held-out episodes (the "
            "behaviour data row, 1.00 by definition); mean ± standard error over seeds. "
            "Context offline: one recorded episode of the held-out goal, whole or a window as "
            "the config says (each skill's line below); "
            "online: exploration episodes in the simulator, run by the policy each skill's line "
            "names (docs/episodes.md#online-context), the same trained parameters. "
            f"Machine: {machine['cpu']}, {machine['cores']} cores, no "
            "GPU; the wall column: the whole `offmeta run` (train and evaluate stages, training "
            "rate, 1-minute load at its start), and for online rows the online evaluation.",
            "",
            *(f"- {note}" for note in notes),
            "",
            PUBLISHED_NOTE,
        ]
    )


PUBLISHED_NOTE = (
    "The published rows are CTMRL's README table (github.com/hehongc/CTMRL; GENTLE's own "
    "figure on push 0.82): Meta-World v2 skills (reach-wall-v2, with a wall, for reach), "
    "offline data from the scripted expert with N(0, 0.1) action noise, about 300k gradient "
    "steps, 256-wide networks, online few-shot context. Here: v3 skills (reach-v3 has no wall), "
    "the same data protocol recorded by offmeta, 6,000-12,000 meta-iterations (each skill's "
    "line above) of the context learner that clones the expert's actions (no value function), "
    "evaluated on 10 held-out goals with one episode each."
)


def _rows(skill: str, label: str, group: list[dict[str, Any]], notes: list[str]) -> list[str]:
    """The rows of one (skill, algorithm): behaviour data, expert, unadapted, adapted offline,
    adapted online per settings; ``notes`` gets its shape line."""
    newest = max(group, key=lambda r: r["date"])

    def training(record: dict[str, Any]) -> str:
        shape = {k: v for k, v in record["shape"].items() if k != "seed"}
        return json.dumps(shape, sort_keys=True)

    same = [r for r in group if training(r) == training(newest)]
    latest: dict[int, dict[str, Any]] = {}
    by_online: dict[str, dict[int, dict[str, Any]]] = {}
    for record in sorted(same, key=lambda r: r["date"]):
        latest[record["shape"]["seed"]] = record
        if "online" in record["details"]:
            settings = json.dumps(record["details"]["online"]["settings"], sort_keys=True)
            by_online.setdefault(settings, {})[record["shape"]["seed"]] = record
    chosen = [latest[seed] for seed in sorted(latest)]
    details = [r["details"] for r in chosen]
    dataset = details[-1]["dataset"]
    rows = [
        f"| {skill} | behaviour data (held-out goals) | | 1.00 | {dataset['success']:.2f} | "
        f"{dataset['success_final']:.2f} | {dataset['return']:.0f} | | |",
        _row(skill, "scripted expert", "none (given the goal)", details, "expert"),
        _row(skill, f"{label}, unadapted", "none (the prior)", details, "unadapted"),
        _row(skill, f"{label}, adapted", "offline", details, "adapted", wall=_wall(chosen)),
    ]
    for settings, seeds in by_online.items():
        online = [seeds[seed]["details"]["online"] for seed in sorted(seeds)]
        what = ", ".join(
            f"`{k.removeprefix('evaluation.')}={v}`"
            for k, v in json.loads(settings).items()
            if k != "evaluation.context"
        )
        walls = [o["wall_s"] for o in online]
        loads = [o["load_1min"][0] for o in online]
        wall = f"{np.mean(walls):.0f} s, load {min(loads):.0f}-{max(loads):.0f}"
        rows.append(
            _row(skill, f"{label}, adapted", f"online: {what}", online, "adapted", wall=wall)
        )
    shape = newest["shape"]
    where = "; ".join(dataset.get("where") or ["all"])
    heldout = shape.get("heldout_context")
    notes.append(
        f"{skill}, {label}: {shape['train_goals']} train goals x {shape['episodes_per_goal']} "
        f"episodes, {shape['support']} of context in training"
        + (f" ({heldout} of held-out context)" if heldout else "")
        + f", Q={shape['query']}, {shape['meta_batch']} "
        f"tasks per meta-batch, {shape['iterations']} meta-iterations; normalised by the "
        f"{dataset['episodes']} held-out episodes `data.episodes_where.heldout` keeps "
        f"({where}); online context: {online_context(by_online)}; seeds "
        f"{', '.join(str(r['shape']['seed']) for r in chosen)}, records of "
        f"{newest['date'][:10]} at {(newest['git']['revision'] or 'no git')[:10]}."
    )
    return rows


def online_context(by_online: Mapping[str, Mapping[int, dict[str, Any]]]) -> str:
    """The online evaluations' context lines, as the reports wrote them."""
    lines = {
        record["details"]["online"]["context"].removeprefix("online: ")
        for seeds in by_online.values()
        for record in seeds.values()
    }
    return "; ".join(sorted(lines)) or "not evaluated"


def _row(
    skill: str,
    label: str,
    context: str,
    details: list[dict[str, Any]],
    policy: str,
    *,
    wall: str = "",
) -> str:
    from bench.metaworld import mean_and_error  # bench.metaworld imports this module

    cells = [skill, label, context]
    for key, digits in (
        (f"normalised_{policy}", ".2f"),
        (f"success_{policy}", ".2f"),
        (f"success_final_{policy}", ".2f"),
        (f"return_{policy}", ".0f"),
    ):
        mean, error = mean_and_error([d.get(key, math.nan) for d in details])
        cells.append(f"{mean:{digits}} ± {error:{digits}}")
    return "| " + " | ".join([*cells, str(len(details)), wall]) + " |"


def _wall(runs: list[dict[str, Any]]) -> str:
    details = [r["details"] for r in runs]
    walls = [d["wall_s"] for d in details]
    train = [d.get("train_s", math.nan) for d in details]
    rates = [d.get("iterations_per_s", math.nan) for d in details]
    loads = [d["load_1min"][0] for d in details]
    return (
        f"{np.mean(walls):.0f} s (train {np.mean(train):.0f}), {np.mean(rates):.1f} it/s, "
        f"load {min(loads):.0f}-{max(loads):.0f}"
    )
