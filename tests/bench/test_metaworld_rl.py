"""The offline-RL variant of push (flows/configs/metaworld_push_rl.yaml, bench/metaworld.py's
``context-rl``): the cloning config's data, context and encoder with a value function and
advantage-weighted regression; its rows in docs/metaworld.md's table; the bench refusing a
skill that has no such config before it touches the data."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.metaworld import _record_offline_rl
from bench.metaworld_tables import render_results
from bench.records import read_records, write_record
from flows.config import load_config
from tests.helpers.paths import REPO

CONFIGS = REPO / "flows" / "configs"


def test_the_rl_config_is_the_cloning_one_with_a_value_function() -> None:
    cloning = load_config(CONFIGS / "metaworld_push.yaml")
    rl = load_config(CONFIGS / "metaworld_push_rl.yaml")
    assert rl.data.episodes_where == cloning.data.episodes_where
    assert (rl.data.train, rl.data.heldout) == (cloning.data.train, cloning.data.heldout)
    assert (REPO / rl.data.train).is_dir() and (REPO / rl.data.heldout).is_dir()
    assert rl.data.normalize == ["obs", "returns"]
    assert rl.tasks == cloning.tasks
    shared = {"latent_dim", "fields", "standardize_transitions", "policy", "encoder"}
    assert rl.learners.context.model_dump(include=shared) == cloning.learners.context.model_dump(
        include=shared
    )
    assert rl.learners.context.value == "value"
    modules = rl.learners.modules
    assert modules["encoder"] == cloning.learners.modules["encoder"]
    assert modules["default_policy"].model.head == "gaussian"
    assert (modules["value"].obs_dim, modules["value"].action_dim) == (39, 1)
    assert rl.training.iterations == cloning.training.iterations
    assert rl.evaluation == cloning.evaluation
    assert rl.artifacts.name == "metaworld-push-context-rl"  # what the bench reads back


def _run(directory: Path, algorithm: str, seed: int, returned: float) -> None:
    details = {
        f"{measure}_{policy}": 0.5 if measure != "return" else returned
        for policy in ("unadapted", "adapted", "expert")
        for measure in ("success", "success_final", "return")
    }
    details |= {"behaviour": {"success": 0.44, "success_final": 0.24, "return": 1702.0}}
    details |= {"wall_s": 600.0, "stages": "took 590.0 s: train 300.0 s, evaluate 200.0 s"}
    shape = {
        "skill": "push-v3",
        "algorithm": algorithm,
        "iterations": 6000,
        "train_goals": 40,
        "heldout_goals": 10,
        "episodes_per_goal": 12,
        "support": "1 episode(s) x 50 steps",
        "query": 50,
        "meta_batch": 12,
        "seed": seed,
    }
    write_record(
        "metaworld",
        f"run-push-{algorithm}-seed{seed}",
        "a run",
        0.5,
        "success rate",
        shape=shape,
        details=details,
        directory=directory,
    )


def test_the_table_labels_the_offline_rl_rows(tmp_path: Path) -> None:
    for seed in range(3):
        _run(tmp_path, "context", seed, 3000.0)
        _run(tmp_path, "context-rl", seed, 3500.0 + 100 * seed)
    lines = render_results(read_records(tmp_path)).splitlines()
    rows = [line for line in lines if line.startswith("| push-v3 | context encoder + value")]
    assert rows[0].startswith("| push-v3 | context encoder + value (AWR), unadapted |")
    assert rows[1].startswith(
        "| push-v3 | context encoder + value (AWR), adapted | 0.50 ± 0.00 | 0.50 ± 0.00 | "
        "3600 ± 58 | 3 |"
    )
    assert any(
        line.startswith("- push-v3, context encoder + value (AWR): 1 episode(s)") for line in lines
    )


def test_the_bench_refuses_a_skill_without_the_algorithms_config(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, str(REPO / "bench" / "metaworld.py"), "--skills", "reach"),
            *("--algorithms", "context-rl", "--data", str(tmp_path), "--no-record"),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert done.returncode == 2
    assert (
        "no shipped config flows/configs/metaworld_reach_rl.yaml: leave that skill or algorithm "
        "out" in done.stderr
    )
    assert not any(tmp_path.iterdir())  # refused before recording any data


def _args(tmp_path: Path) -> argparse.Namespace:
    data = tmp_path / "data"
    (data / "push" / "train").mkdir(parents=True)
    sample = REPO / "data" / "samples" / "metaworld_push" / "train" / "dataset.json"
    shutil.copy(sample, data / "push" / "train" / "dataset.json")
    return argparse.Namespace(data=data, iterations=None, recording="a", seeds=[0, 1, 2])


@pytest.mark.parametrize("cloning_here", [True, False])
def test_offline_rl_is_compared_with_cloning_on_return(tmp_path: Path, cloning_here: bool) -> None:
    results = tmp_path / "results"
    summary = {"context-rl": {"return_adapted": (3600.0, 30.0)}}
    cloning = {"return_adapted": (3000.0, 40.0)}
    if cloning_here:
        summary["context"] = cloning
    else:  # an earlier summary of the cloning runs
        write_record(
            "metaworld",
            "summary-push-context",
            "cloning",
            0.77,
            "success rate",
            shape={},
            details={"by_algorithm": {"context": cloning}},
            directory=results,
        )
    _record_offline_rl("push", summary, {"seeds": [0, 1, 2]}, _args(tmp_path), results)
    (record,) = [r for r in read_records(results) if r["figure"].endswith("rl-vs-context")]
    assert record["figure"] == "summary-push-context-rl-vs-context"
    assert (record["value"], record["baseline"]["value"]) == (3600.0, 3000.0)
    assert record["ratio"] == pytest.approx(1.2) and record["met"] is True
    assert record["details"]["lead_se"] == pytest.approx(600.0 / 50.0)
    assert record["shape"]["algorithm"] == "context-rl" and record["shape"]["seeds"] == 3
    source = record["details"]["baseline_from"]
    expected = "this call's runs" if cloning_here else "record summary-push-context of "
    assert source.startswith(expected)


def test_without_cloning_to_compare_with_nothing_is_recorded(tmp_path: Path) -> None:
    summary = {"context-rl": {"return_adapted": (3600.0, 30.0)}}
    _record_offline_rl("push", summary, {}, _args(tmp_path), tmp_path / "results")
    assert read_records(tmp_path / "results") == []
