"""The pictures of a published version: the learning curve by meta-iteration, the adaptation
curve (with the parent's) and the rollouts, each a PNG of fixed size drawn from the JSON
stored beside it, the same bytes for the same data."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flows.config import TrainingConfig
from flows.evaluation.heldout import EvaluationReport, evaluate
from flows.evaluation.pictures import (
    ADAPTATION_PX,
    ROLLOUTS_PX,
    adaptation_data,
    draw_adaptation,
    draw_rollouts,
    picture_files,
)
from learners.meta.learner import MetaLearner
from pipeline.artifacts import ArtifactError
from pipeline.artifacts.plots import (
    CURVE_PANEL_PX,
    CURVE_TITLE_PX,
    CURVE_WIDTH_PX,
    check_history,
    learning_curve_files,
)
from pipeline.reads.episodes import read_episodes
from pipeline.streams.columns import column_array
from pipeline.synthetic import PointRobotTasks, generate
from pipeline.synthetic.point_robot_episodes import BEHAVIOR_COLUMN
from tests.helpers.flow_runs import tiny_config
from tests.helpers.paths import REPO
from tests.helpers.published_pictures import PICTURES, png_size, standard_error

ITERATIONS = list(range(30, 301, 30))


def _history(*, learned_lr: bool) -> dict[str, list]:
    x = np.array(ITERATIONS, dtype=np.float64)
    history = {
        "iteration": ITERATIONS,
        "query_loss": (0.5 * np.exp(-x / 40) + 0.002).tolist(),
        "support_loss_before": (0.6 * np.exp(-x / 80) + 0.006).tolist(),
        "support_loss_after": (0.5 * np.exp(-x / 40) + 0.0015).tolist(),
        "grad_norm": (0.2 * np.exp(-x / 100) + 0.05).tolist(),
    }
    if learned_lr:
        history["inner_lr_mean"] = (0.5 + 0.01 * x / 30).tolist()
        history["inner_lr_min"] = (0.3 + 0.005 * x / 30).tolist()
        history["inner_lr_max"] = (0.7 + 0.02 * x / 30).tolist()
    return history


def test_the_learning_curve_shares_one_loss_axis_and_plots_against_iterations() -> None:
    history = check_history(_history(learned_lr=True))
    files = learning_curve_files(history, "robot learning curve")
    data = json.loads(files["learning_curve.json"])
    assert data["x"] == "iteration"
    assert data["history"] == history
    assert data["panels"] == [
        {
            "name": "loss",
            "metrics": ["query_loss", "support_loss_before", "support_loss_after"],
            "scale": "log",  # 0.6 down to 0.002: more than two decades
        },
        {"name": "grad_norm", "metrics": ["grad_norm"], "scale": "linear"},
        {
            "name": "inner_lr",
            "metrics": ["inner_lr_mean", "inner_lr_min", "inner_lr_max"],
            "scale": "linear",
        },
    ]
    assert png_size(files["learning_curve.png"]) == (
        CURVE_WIDTH_PX,
        CURVE_TITLE_PX + 3 * CURVE_PANEL_PX,
    )
    assert learning_curve_files(history, "robot learning curve") == files


def test_the_learning_curve_without_learned_rates_has_two_panels() -> None:
    files = learning_curve_files(check_history(_history(learned_lr=False)), "maml")
    data = json.loads(files["learning_curve.json"])
    assert [panel["name"] for panel in data["panels"]] == ["loss", "grad_norm"]
    assert png_size(files["learning_curve.png"]) == (
        CURVE_WIDTH_PX,
        CURVE_TITLE_PX + 2 * CURVE_PANEL_PX,
    )


def test_a_history_without_iterations_is_drawn_by_recorded_point() -> None:
    files = learning_curve_files(check_history({"query_mse": [3.1, 0.9, 0.35]}), "sine")
    data = json.loads(files["learning_curve.json"])
    assert data["x"] == "logged point"
    assert data["panels"] == [{"name": "query_mse", "metrics": ["query_mse"], "scale": "linear"}]


def test_other_data_gives_other_bytes() -> None:
    history = _history(learned_lr=False)
    changed = {**history, "grad_norm": [v * 2 for v in history["grad_norm"]]}
    first = learning_curve_files(check_history(history), "maml")["learning_curve.png"]
    second = learning_curve_files(check_history(changed), "maml")["learning_curve.png"]
    assert first != second


@pytest.mark.parametrize(
    ("history", "message"),
    [
        (
            {"iteration": [3, 3], "loss": [1.0, 0.5]},
            "history['iteration'][1] is 3; expected meta-iterations as integers increasing "
            "from 4 on",
        ),
        (
            {"iteration": [1, 2.5], "loss": [1.0, 0.5]},
            "history['iteration'][1] is 2.5; expected meta-iterations as integers increasing "
            "from 2 on",
        ),
        (
            {"iteration": [10, 20]},
            "history holds only 'iteration'; expected at least one metric beside it",
        ),
        (
            {"iteration": [10, 20, 30], "loss": [1.0, 0.5]},
            "history['loss'] has 2 values but history['iteration'] has 3; expected one value "
            "per recorded iteration",
        ),
    ],
)
def test_a_history_whose_iterations_do_not_fit_is_refused(history: dict, message: str) -> None:
    with pytest.raises(ArtifactError) as caught:
        check_history(history)
    assert str(caught.value) == message


def test_the_history_cadence_follows_history_points_not_log_every() -> None:
    assert TrainingConfig(iterations=3000, log_every=300).history_every == 30
    assert TrainingConfig(iterations=1000, history_points=300).history_every == 4
    assert TrainingConfig(iterations=12).history_every == 1


def _report(losses: dict[int, list[float]], tasks: int = 3) -> EvaluationReport:
    return EvaluationReport(
        tasks=tasks,
        support=5,
        query=5,
        query_loss={s: float(np.mean(v)) for s, v in losses.items()},
        task_ids=tuple(f"task-{i}" for i in range(tasks)),
        query_loss_per_task=losses,
    )


LOSSES = {0: [0.9, 1.1, 1.3], 1: [0.2, 0.25, 0.4], 5: [0.1, 0.12, 0.2]}


def test_the_adaptation_curve_holds_mean_and_standard_error_of_this_version_and_its_parent():
    report = _report(LOSSES)
    parent_losses = {0: [1.5, 1.7], 1: [0.6, 0.7]}
    parent = _report(parent_losses, tasks=2).to_dict()
    data = adaptation_data("robot", report, ("robot:1", parent))
    this, before = data["curves"]
    assert (this["label"], this["version"], this["tasks"]) == ("this version", None, 3)
    assert this["steps"] == [0, 1, 5]
    assert this["mean"] == list(report.query_loss.values())
    assert this["per_task"] == {"0": LOSSES[0], "1": LOSSES[1], "5": LOSSES[5]}
    assert this["stderr"] == pytest.approx([standard_error(LOSSES[s]) for s in (0, 1, 5)])
    assert (before["label"], before["version"]) == ("parent robot:1", "robot:1")
    assert (before["tasks"], before["steps"]) == (2, [0, 1])
    assert before["mean"] == [parent["query_loss"]["0"], parent["query_loss"]["1"]]
    assert before["stderr"] == pytest.approx([standard_error(parent_losses[s]) for s in (0, 1)])
    png = draw_adaptation(data)
    assert png_size(png) == ADAPTATION_PX
    assert draw_adaptation(json.loads(json.dumps(data))) == png


def test_a_parent_evaluated_before_per_task_losses_were_kept_has_no_error_bars() -> None:
    old = {"tasks": 50, "query_loss": {"0": 0.9, "1": 0.3}}
    data = adaptation_data("robot", _report(LOSSES), ("robot:1", old))
    parent = data["curves"][1]
    assert parent["mean"] == [0.9, 0.3] and parent["stderr"] == [None, None]
    assert parent["per_task"] == {}
    assert png_size(draw_adaptation(data)) == ADAPTATION_PX


def _trajectories(behavior: bool) -> dict:
    steps = np.linspace(0.0, 1.0, 21)[:, None]
    goals = [[np.cos(a), np.sin(a)] for a in (0.3, 1.2, 2.0, 2.8)]

    def path(goal: list[float], scale: float) -> list[list[float]]:
        return (steps * np.array(goal) * scale).tolist()

    return {
        "environment": "point_robot",
        "adapt_steps": 5,
        "seed": 0,
        "goals": [
            {
                "task_id": f"heldout-{i}",
                "goal": goal,
                "policies": {
                    "unadapted": {"positions": path([0.2, 1.0], 1.0), "return": -15.0},
                    "adapted": {"positions": path(goal, 0.9), "return": -6.5},
                    "expert": {"positions": path(goal, 1.0), "return": -4.5},
                },
                "behavior": [
                    {"eps_id": 7, "behavior": "random", "positions": path(goal, 0.5), "return": -9}
                ]
                if behavior
                else None,
            }
            for i, goal in enumerate(goals)
        ],
    }


@pytest.mark.parametrize("behavior", [False, True])
def test_rollouts_are_one_panel_per_goal_at_a_fixed_size(behavior: bool) -> None:
    data = {"title": "robot: held-out rollouts", **_trajectories(behavior)}
    png = draw_rollouts(data)
    assert png_size(png) == ROLLOUTS_PX
    assert draw_rollouts(json.loads(json.dumps(data))) == png


def test_without_positions_the_rollouts_are_per_task_returns_at_a_fixed_size() -> None:
    data = {
        "title": "walker: held-out rollouts",
        "environment": "my_sim.envs:make_env",
        "adapt_steps": 2,
        "seed": 0,
        "episodes": 3,
        "tasks": [
            {"task_id": f"heldout-{i}", "returns": {"unadapted": -9.0 + i, "adapted": -3.0 - i}}
            for i in range(6)
        ],
    }
    png = draw_rollouts(data)
    assert png_size(png) == ROLLOUTS_PX
    assert draw_rollouts(json.loads(json.dumps(data))) == png
    assert draw_rollouts({**data, "tasks": data["tasks"][::-1]}) != png


def test_paths_without_a_goal_are_drawn_without_one() -> None:
    data = {"title": "robot: held-out rollouts", **_trajectories(False)}
    for goal in data["goals"]:
        goal["goal"] = None
    png = draw_rollouts(data)
    assert png_size(png) == ROLLOUTS_PX
    assert png != draw_rollouts({"title": "robot: held-out rollouts", **_trajectories(False)})


def test_picture_files_pair_each_png_with_its_data() -> None:
    report = _report(LOSSES)
    assert [name for name, _ in picture_files("robot", report)] == [
        "adaptation.png",
        "adaptation.json",
    ]
    with_rollouts = EvaluationReport(**{**report.__dict__, "trajectories": _trajectories(False)})
    files = dict(picture_files("robot", with_rollouts))
    assert list(files) == ["adaptation.png", "adaptation.json", "rollouts.png", "rollouts.json"]
    assert json.loads(files["rollouts.json"]) == {
        "title": "robot: held-out rollouts",
        **_trajectories(False),
    }
    assert json.loads(files["adaptation.json"]) == adaptation_data("robot", report)


@pytest.fixture(scope="module")
def robot_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny point-robot data whose held-out copy ``heldout_rl`` marks each episode's
    behaviour, as offline-RL datasets do."""
    root = tmp_path_factory.mktemp("robot")
    generate(PointRobotTasks(episodes_per_task=3), root, tasks=4, heldout_tasks=5, seed=0)
    marked = root / "heldout_rl"
    marked.mkdir()
    for source in sorted((root / "heldout").iterdir()):
        if source.suffix != ".parquet":
            (marked / source.name).write_bytes(source.read_bytes())
            continue
        table = pq.read_table(source)
        odd = pc.bit_wise_and(pc.cast(table.column("eps_id"), pa.int64()), 1).to_numpy()
        labels = pa.array(np.where(odd == 1, "random", "noisy")).dictionary_encode()
        pq.write_table(table.append_column(BEHAVIOR_COLUMN, labels), marked / source.name)
    return root


@pytest.mark.usefixtures("ray_session")
def test_offline_rl_rollouts_add_the_recorded_episodes_of_the_same_goals(
    robot_data: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(robot_data, tmp_path, ["evaluation.tasks=5"])
    state = MetaLearner(cfg.learners.meta_config()).get_state()

    plain = evaluate(cfg, state, read_episodes(robot_data / "heldout")).trajectories
    assert len(plain["goals"]) == 4  # four of the five evaluated goals
    assert all(goal["behavior"] is None for goal in plain["goals"])
    angles = [np.arctan2(g["goal"][1], g["goal"][0]) for g in plain["goals"]]
    assert angles == sorted(angles)
    for goal in plain["goals"]:
        assert list(goal["policies"]) == ["unadapted", "adapted", "expert"]
        starts = {tuple(p["positions"][0]) for p in goal["policies"].values()}
        assert len(starts) == 1  # every policy from the same start
        assert all(len(p["positions"]) == 21 for p in goal["policies"].values())

    heldout = read_episodes(robot_data / "heldout_rl")
    marked = evaluate(cfg, state, heldout).trajectories
    assert [g["policies"] for g in marked["goals"]] == [g["policies"] for g in plain["goals"]]
    table = pa.concat_tables(
        pq.read_table(path) for path in sorted((robot_data / "heldout_rl").glob("*.parquet"))
    )
    for goal in marked["goals"]:
        rows = table.filter(
            pc.equal(pc.cast(table.column("task_id"), pa.string()), goal["task_id"])
        )
        episodes = sorted(set(rows.column("eps_id").to_pylist()))
        assert [e["eps_id"] for e in goal["behavior"]] == episodes
        for episode in goal["behavior"]:
            one = rows.filter(pc.equal(rows.column("eps_id"), episode["eps_id"])).sort_by("t")
            obs, new_obs = column_array(one, "obs"), column_array(one, "new_obs")
            assert episode["positions"] == np.vstack([obs, new_obs[-1:]]).tolist()
            rewards = column_array(one, "rewards").astype(np.float64)
            assert episode["return"] == float(rewards.sum())
            label = "random" if episode["eps_id"] % 2 else "noisy"
            assert episode["behavior"] == label


def test_the_docs_show_the_three_pictures_of_a_run() -> None:
    root = REPO / "docs"
    linked = re.findall(r"^!\[[^\]]*\]\(([^)]+)\)$", (root / "runs.md").read_text(), re.M)
    assert linked == [f"pictures/{p}.png" for p in PICTURES]
    sizes = {Path(link).stem: png_size((root / link).read_bytes()) for link in linked}
    assert sizes["adaptation"] == ADAPTATION_PX and sizes["rollouts"] == ROLLOUTS_PX
    assert sizes["learning_curve"] == (CURVE_WIDTH_PX, CURVE_TITLE_PX + 2 * CURVE_PANEL_PX)
