"""docs/metaworld.md's results table (bench/metaworld_tables.py ``render_results``): per skill the
behaviour data, the expert and each algorithm's unadapted and adapted policy, mean ± s.e. over
the latest run of each seed, runs of another shape left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.metaworld import behaviour_stats, config_path, main
from bench.metaworld_tables import render_results
from bench.records import read_records, write_record
from tests.helpers.paths import REPO

SHAPE = {
    "skill": "reach-v3",
    "algorithm": "maml",
    "iterations": 2000,
    "train_goals": 40,
    "heldout_goals": 10,
    "episodes_per_goal": 12,
    "support": 20,
    "query": 20,
    "meta_batch": 10,
}


def _run(directory: Path, seed: int, adapted: float, **shape: object) -> None:
    details = {
        f"{measure}_{policy}": value
        for policy, value in (("unadapted", 0.1), ("adapted", adapted), ("expert", 1.0))
        for measure in ("success", "success_final", "return")
    }
    details |= {"behaviour": {"success": 0.5, "success_final": 0.25, "return": 1234.0}}
    write_record(
        "metaworld",
        f"run-reach-maml-seed{seed}",
        "a run",
        adapted,
        "success rate",
        shape={**SHAPE, **shape, "seed": seed},
        details={
            **details,
            "wall_s": 100.0 + seed,
            "stages": f"took 99.0 s: 9.0 s before the flow, train {60 + seed}.0 s, evaluate 20.0 s",
        },
        directory=directory,
    )


def test_the_table_sums_up_the_latest_runs_of_the_newest_shape(tmp_path: Path) -> None:
    _run(tmp_path, 0, 0.2, iterations=10)  # another shape: left out
    for seed, adapted in enumerate([0.6, 0.8, 1.0]):
        _run(tmp_path, seed, adapted)
    lines = render_results(read_records(tmp_path)).splitlines()
    errors = np.std([0.6, 0.8, 1.0], ddof=1) / np.sqrt(3)
    assert lines[2] == "| reach-v3 | behaviour data (held-out goals) | 0.50 | 0.25 | 1234 | | |"
    assert lines[3].startswith("| reach-v3 | scripted expert | 1.00 ± 0.00 | 1.00 ± 0.00 |")
    assert lines[5] == (
        f"| reach-v3 | MAML cloning, adapted | 0.80 ± {errors:.2f} | 0.80 ± {errors:.2f} | "
        f"1 ± 0 | 3 | 101 s (train 61, evaluate 20) |"
    )
    assert lines[9].startswith("- reach-v3, MAML cloning: K=20 support transitions of context")
    assert "2000 meta-iterations; seeds 0, 1, 2" in lines[9]
    assert "No validation records yet" in lines[-1]


def test_skills_are_listed_in_the_bench_order(tmp_path: Path) -> None:
    for skill in ("pick-place-v3", "push-v3", "reach-v3"):
        _run(tmp_path, 0, 0.5, skill=skill)
    lines = render_results(read_records(tmp_path)).splitlines()
    behaviour_rows = [line for line in lines if "behaviour data" in line]
    assert [row.split(" | ")[0] for row in behaviour_rows] == [
        "| reach-v3",
        "| push-v3",
        "| pick-place-v3",
    ]


def test_pick_place_has_the_context_config_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert config_path("pick-place", "context") == (
        REPO / "flows" / "configs" / "metaworld_pick_place.yaml"
    )
    assert config_path("pick-place", "context").is_file()
    monkeypatch.setattr(
        "sys.argv", ["metaworld.py", "--skills", "pick-place", "--algorithms", "context", "maml"]
    )
    with pytest.raises(SystemExit):
        main()
    assert capsys.readouterr().err.splitlines()[-1] == (
        "metaworld.py: error: no shipped config flows/configs/metaworld_pick_place_maml.yaml: "
        "leave that skill or algorithm out (pick-place has the context learner's only: "
        "--algorithms context)"
    )


def test_no_records_say_how_to_make_them(tmp_path: Path) -> None:
    assert render_results(read_records(tmp_path)) == "No records yet: run `bench/metaworld.py`."


def test_behaviour_stats_count_each_episode_once(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table(
            {
                "eps_id": [1, 1, 0, 0],
                "t": [1, 0, 1, 0],
                "rewards": [1.0, 2.0, 3.0, 4.0],
                "success": [False, True, True, False],
                "truncateds": [True, False, True, False],
            }
        ),
        tmp_path / "part-00000.parquet",
    )
    (tmp_path / "dataset.json").write_text("{}")  # beside the files, as in every dataset
    assert behaviour_stats(tmp_path) == {
        "success": 1.0,
        "success_final": 0.5,
        "return": 5.0,
        "episodes": 2,
    }


def test_a_record_s_shape_names_the_held_out_context_when_the_config_sets_it(
    tmp_path: Path,
) -> None:
    import argparse
    import shutil

    from bench.metaworld import _shape

    sample = REPO / "data" / "samples" / "metaworld_reach" / "train"
    (tmp_path / "reach" / "train").mkdir(parents=True)
    shutil.copy(sample / "dataset.json", tmp_path / "reach" / "train" / "dataset.json")
    args = argparse.Namespace(data=tmp_path, recording="a", iterations=None)
    assert _shape("reach", "context", args)["heldout_context"] == "whole episodes"
    assert "heldout_context" not in _shape("reach", "maml", args)
