"""The validation split of bench/metaworld.py (``bench/metaworld_validation.py``): the last N
train goals held aside, disjoint from and together complete with the goals left to train
on, each split with its own ``dataset.json`` entries; and the table of validation records."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bench.metaworld_tables import render_validation
from bench.metaworld_validation import validation_goals, validation_split
from bench.records import read_records, write_record
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.paths import REPO

SAMPLE = REPO / "data" / "samples" / "metaworld_reach" / "train"
POINT = {
    f"{measure}_{policy}": 0.5
    for measure in ("success", "success_final", "return")
    for policy in ("unadapted", "adapted")
}
"""One point of a learning curve, every figure 0.5."""


def test_the_split_holds_the_last_goals_aside_and_keeps_every_row(tmp_path: Path) -> None:
    paths = validation_split(SAMPLE, 2, tmp_path / "validation")
    tasks = sorted(json.loads((SAMPLE / "dataset.json").read_text())["tasks"])
    assert validation_goals(SAMPLE, 2) == tasks[-2:]
    rows = {split: pq.read_table(path / "part-00000.parquet") for split, path in paths.items()}
    held = set(rows["heldout"].column("task_id").to_pylist())
    kept = set(rows["train"].column("task_id").to_pylist())
    assert held == set(tasks[-2:]) and kept == set(tasks[:-2])
    assert (
        rows["train"].num_rows + rows["heldout"].num_rows
        == pq.read_metadata(SAMPLE / "part-00000.parquet").num_rows
    )
    for split, path in paths.items():
        described = json.loads((path / "dataset.json").read_text())
        assert set(described["tasks"]) == (held if split == "heldout" else kept)
        assert described["num_rows"] == rows[split].num_rows
        assert set(inspect_episodes(path).task_ids) == set(described["tasks"])


def test_a_split_that_leaves_no_goal_is_refused() -> None:
    with pytest.raises(SystemExit, match="has 6 goals; hold aside at least one"):
        validation_goals(SAMPLE, 6)


def test_the_validation_table_lists_each_trial_and_its_curve(tmp_path: Path) -> None:
    assert "No validation records yet" in render_validation(read_records(tmp_path))
    write_record(
        "metaworld",
        "validation-reach-context-lr-seed0",
        "a validation run",
        0.8,
        "success rate",
        shape={"skill": "reach-v3", "algorithm": "context", "seed": 0, "trial": {"a.b": "1"}},
        details={
            "validation_goals": ["train-00038", "train-00039"],
            "curve": [
                {"iteration": 1000, **POINT},
                {"iteration": 2000, **POINT, "success_adapted": 0.8},
            ],
            "wall_s": 300.0,
            "iterations_per_s": 20.0,
        },
        directory=tmp_path,
    )
    table = render_validation(read_records(tmp_path)).splitlines()
    curve = "1000: 0.50 (0.50); 2000: 0.80 (0.50)"
    assert table[2].startswith("| reach-v3 | context encoder | `a.b=1` (at ")
    assert f" | 0 | {curve} | 0.50 | 20.0 | 300 s" in table[2]
    assert table[-1].startswith("Each run trains on the train goals but the last 2 (in task")
    assert "recording" not in table[2]  # recording (a), the default, goes unnamed


def test_a_validation_run_on_recording_b_says_so(tmp_path: Path) -> None:
    write_record(
        "metaworld",
        "validation-reach-context-seed0",
        "a validation run",
        0.5,
        "success rate",
        shape={"skill": "reach-v3", "algorithm": "context", "seed": 0, "recording": "b"},
        details={
            "validation_goals": ["train-00039"],
            "curve": [{"iteration": 6000, **POINT}],
            "wall_s": 300.0,
            "iterations_per_s": 20.0,
        },
        directory=tmp_path,
    )
    row = render_validation(read_records(tmp_path)).splitlines()[2]
    assert row.startswith("| reach-v3 | context encoder | as shipped (at ")
    assert "), recording (b) | 0 | 6000: 0.50 (0.50) |" in row


def test_the_validation_table_names_each_skills_goals_held_aside(tmp_path: Path) -> None:
    for skill, goals in (("reach-v3", 5), ("pick-place-v3", 10)):
        write_record(
            "metaworld",
            f"validation-{skill.removesuffix('-v3')}-context-seed0",
            "a validation run",
            0.5,
            "success rate",
            shape={"skill": skill, "algorithm": "context", "seed": 0, "trial": {}},
            details={
                "validation_goals": [f"train-{40 - goal:05d}" for goal in range(goals)],
                "curve": [{"iteration": 6000, **POINT}],
                "wall_s": 300.0,
                "iterations_per_s": 20.0,
            },
            directory=tmp_path,
        )
    table = render_validation(read_records(tmp_path)).splitlines()
    assert table[-1].startswith(
        "Each run trains on the train goals but the last few in task-id order (reach-v3: 5, "
        "pick-place-v3: 10) and evaluates"
    )
