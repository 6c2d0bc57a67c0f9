"""``data.episodes_where`` in a run's config: parsed, turned into the reads' filters, and
refused before Ray starts (``flows.stages.datasets.inspect_datasets``)."""

from __future__ import annotations

import pytest

from flows.config import ConfigError, load_config
from flows.evaluation.heldout import EvaluationReport
from flows.stages.datasets import inspect_datasets
from pipeline.contract.schema import DatasetError
from tests.helpers.paths import REPO

MACAW = REPO / "flows" / "configs" / "point_robot_macaw.yaml"
HELDOUT = REPO / "data" / "samples" / "point_robot_mixed" / "heldout"


def test_each_dataset_keeps_the_episodes_its_own_conditions_select() -> None:
    cfg = load_config(
        MACAW,
        [
            "data.episodes_where.train=[{column: behavior, in: [noisy_expert]}]",
            "data.episodes_where.heldout=[{column: behavior, not_in: [noisy_expert]}]",
        ],
    )
    train, heldout = inspect_datasets(cfg)
    assert train.selection.summary()["where"] == ["behavior in ['noisy_expert']"]
    assert (len(train.selection.kept), train.selection.rows) == (300, 6000)
    assert heldout.selection.summary()["where"] == ["behavior not in ['noisy_expert']"]
    assert (len(heldout.selection.kept), heldout.selection.rows) == (80, 1600)


def test_a_condition_takes_exactly_one_test() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(MACAW, ["data.episodes_where.train=[{column: behavior, in: [a], ever: b}]"])
    assert str(caught.value) == (
        f"invalid config {MACAW} (1 error):\n  data.episodes_where.train.0: column "
        "'behavior': expected exactly one of in, not_in, ever; got 2"
    )


def test_a_held_out_condition_on_a_missing_column_names_its_key_and_the_column() -> None:
    cfg = load_config(MACAW, ["data.episodes_where.heldout=[{column: success, ever: true}]"])
    with pytest.raises(DatasetError) as caught:
        inspect_datasets(cfg)
    assert str(caught.value) == (
        f"data.episodes_where.heldout: column 'success' is not in dataset {HELDOUT} (its "
        "columns: actions, behavior, eps_id, new_obs, obs, rewards, t, task_id, terminateds, "
        "truncateds); expected a column of every file, such as a pass-through behaviour label"
    )


def test_the_held_out_report_names_the_conditions() -> None:
    report = EvaluationReport(
        tasks=2,
        support=3,
        query=4,
        query_loss={0: 1.0, 1: 0.5},
        episodes_where=["behavior in ['noisy_expert']"],
    )
    assert report.format().splitlines()[0] == (
        "held-out evaluation: 2 tasks, K=3 support / Q=4 query transitions, context offline: "
        "random transitions, held-out episodes where behavior in ['noisy_expert']"
    )
    assert report.to_dict()["episodes_where"] == ["behavior in ['noisy_expert']"]
