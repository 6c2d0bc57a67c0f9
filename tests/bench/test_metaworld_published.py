"""Recording (b) of bench/metaworld.py (``bench/metaworld_published.py``): returns normalised
by the held-out episodes the config keeps, data recorded otherwise refused, and the table of
offline- and online-context figures with the published ones beside."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from bench.metaworld import LABELS, behaviour_stats
from bench.metaworld_published import (
    check_recording,
    normalised,
    online_cache,
    render_published,
)
from bench.records import read_records, write_record
from flows.config import load_config
from pipeline.reads.selection import EpisodeCondition, EpisodeFilter
from tests.helpers.paths import REPO

SAMPLES = REPO / "data" / "samples"


def test_the_dataset_return_is_that_of_the_episodes_the_filter_keeps() -> None:
    heldout = SAMPLES / "metaworld_reach" / "heldout"
    where = EpisodeFilter((EpisodeCondition("behavior", "in", ("noise_0.1",)),))
    stats = behaviour_stats(heldout, where)
    table = pq.read_table(heldout / "part-00000.parquet")
    kept = table.filter(pc.equal(table.column("behavior"), "noise_0.1"))
    returns = [
        pc.sum(kept.filter(pc.equal(kept.column("eps_id"), e)).column("rewards")).as_py()
        for e in pc.unique(kept.column("eps_id")).to_pylist()
    ]
    assert stats["episodes"] == len(returns) == 2  # 2 held-out goals, one such episode each
    assert stats["return"] == pytest.approx(np.mean(returns))
    assert stats["where"] == ["behavior in ['noise_0.1']"]
    assert behaviour_stats(heldout)["episodes"] == 8
    assert normalised({"return_adapted": 3.0, "success_adapted": 1.0}, 2.0) == {
        "normalised_adapted": 1.5
    }


def test_data_recorded_otherwise_is_refused_with_the_command_that_records_it() -> None:
    with pytest.raises(SystemExit, match=r"episodes_per_goal': 4.*--full-published"):
        check_recording(SAMPLES, "metaworld_reach", "b")


def _run(directory: Path, seed: int, adapted: float, online: dict[str, object] | None) -> None:
    figures = {
        f"{measure}_{policy}": value
        for policy, value in (("unadapted", 0.5), ("adapted", adapted), ("expert", 1.0))
        for measure in ("success", "success_final", "normalised")
    } | {"return_unadapted": 50.0, "return_adapted": 100 * adapted, "return_expert": 100.0}
    dataset = {"success": 0.9, "success_final": 0.8, "return": 100.0, "episodes": 450}
    write_record(
        "metaworld",
        f"run-b-reach-context-seed{seed}",
        "a run",
        adapted,
        "normalised return",
        shape={
            "recording": "b",
            "skill": "reach-v3",
            "algorithm": "context",
            "iterations": 6000,
            "train_goals": 40,
            "heldout_goals": 10,
            "episodes_per_goal": 45,
            "support": "1 episode(s) x 50 steps",
            "query": 50,
            "meta_batch": 12,
            "seed": seed,
        },
        details={
            **figures,
            "dataset": dataset | {"where": ["behavior in ['noise_0.1', 'noise_0.5']"]},
            **({"online": online} if online else {}),
            "wall_s": 600.0,
            "train_s": 400.0,
            "iterations_per_s": 15.0,
            "load_1min": [4.0, 5.0],
        },
        directory=directory,
    )


def _online(adapted: float, explore: str | None = None) -> dict[str, object]:
    settings = {"evaluation.context": "online", "evaluation.context_episodes": "5"}
    if explore:
        settings["evaluation.context_explore"] = explore
    return {
        "iteration": 6000,
        "context": "online: 5 exploration episode(s) x 50 steps per task",
        "success_adapted": adapted,
        "success_final_adapted": adapted,
        "return_adapted": 100 * adapted,
        "normalised_adapted": adapted,
        "settings": settings,
        "wall_s": 120.0,
        "load_1min": [3.0, 3.0],
    }


def test_the_table_puts_offline_and_each_online_evaluation_beside_the_published(
    tmp_path: Path,
) -> None:
    assert "No recording (b) records yet" in render_published([], LABELS)
    for seed, adapted in enumerate([0.6, 0.8, 1.0]):
        _run(tmp_path, seed, adapted, _online(adapted + 0.1))
    _run(tmp_path, 0, 0.6, _online(0.9, "posterior"))  # the online evaluation redone
    lines = render_published(read_records(tmp_path), LABELS).splitlines()
    error = np.std([0.6, 0.8, 1.0], ddof=1) / np.sqrt(3)
    assert (
        lines[2]
        == "| reach-v3 | behaviour data (held-out goals) | | 1.00 | 0.90 | 0.80 | 100 | | |"
    )
    assert lines[5] == (
        f"| reach-v3 | context encoder, adapted | offline | 0.80 ± {error:.2f} | 0.80 ± "
        f"{error:.2f} | 0.80 ± {error:.2f} | 80 ± {100 * error:.0f} | 3 | 600 s (train 400), "
        "15.0 it/s, load 4-4 |"
    )
    assert lines[6].startswith(
        f"| reach-v3 | context encoder, adapted | online: `context_episodes=5` | 0.90 ± {error:.2f}"
    )
    assert lines[6].endswith("| 3 | 120 s, load 3-3 |")  # and seed 0 redone, below
    assert lines[7].startswith(
        "| reach-v3 | context encoder, adapted | online: `context_episodes=5`, "
        "`context_explore=posterior` | 0.90 ± 0.00 |"
    )
    assert lines[8] == "| reach-wall-v2 | CTMRL (published) | online | 0.94 | | | | | |"
    assert "normalised by the 450 held-out episodes" in render_published(
        read_records(tmp_path), LABELS
    )


def test_the_offline_summary_names_the_context_window_the_online_ones_the_exploration() -> None:
    from bench.metaworld_published import _context_shape

    shape = {
        "skill": "reach-v3",
        "heldout_context": "whole episodes",
        "online_explore": "refine, step 2",
    }
    assert _context_shape(shape, "offline") == {
        "skill": "reach-v3",
        "heldout_context": "whole episodes",
        "context": "offline",
    }
    online = {"skill": "reach-v3", "online_explore": "refine, step 2"}
    assert _context_shape(shape, "online") == {**online, "context": "online"}
    assert _context_shape(shape, "online-context_episodes-2") == {
        **online,
        "context": "online-context_episodes-2",
    }


def test_an_online_evaluation_is_cached_per_settings_and_evaluation_section(
    tmp_path: Path,
) -> None:
    config = REPO / "flows" / "configs" / "metaworld_reach.yaml"
    settings = {"evaluation.context": "online", "evaluation.context_episodes": "5"}
    applied = [f"{k}={v}" for k, v in settings.items()]
    runs = tmp_path / "seed0" / "runs"
    first = online_cache(load_config(config, applied), runs, settings)
    assert first == online_cache(load_config(config, applied), runs, settings)
    assert first.parent == runs.parent and first.name.startswith("online-")
    # The config's own evaluation settings changed (not the online ones): evaluated again.
    other = load_config(config, [*applied, "evaluation.context_score_steps=5"])
    assert online_cache(other, runs, settings) != first
