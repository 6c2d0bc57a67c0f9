"""The statistics ``data.normalize`` standardises with, gathered by the value checks' pass
(``pipeline.contract.feature_stats``, ``check_value_columns(normalize=...)``): of stored
columns, and of ``returns``, derived from the rewards read, episode by episode."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.contract.feature_stats import ReturnsAccumulator, StatsAccumulator
from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from pipeline.reads.returns import discounted_returns, returns_columns
from pipeline.reads.selection import EpisodeCondition, EpisodeFilter
from tests.helpers.paths import REPO

MIXED = REPO / "data" / "samples" / "point_robot_mixed" / "train"


GAMMA = 0.9


@pytest.fixture(scope="module")
def rows() -> dict[str, np.ndarray]:
    table = pq.read_table(MIXED / "part-00000.parquet")
    in_order = table.sort_by([("eps_id", "ascending"), ("t", "ascending")])
    returns = returns_columns(in_order, GAMMA)["returns"]  # what task samples derive
    return {
        "obs": np.asarray(table.column("obs").combine_chunks().to_numpy_ndarray(), np.float64),
        "rewards": table.column("rewards").to_numpy().astype(np.float64)[:, None],
        "returns": returns.astype(np.float64)[:, None],
        "behavior": np.asarray(table.column("behavior").to_pylist()),
    }


def _assert_stats_of(found, values: np.ndarray) -> None:
    tolerance = len(values) * np.finfo(np.float64).eps * np.abs(values).max()
    assert found.count == len(values)
    np.testing.assert_allclose(found.mean, values.mean(axis=0), rtol=0, atol=tolerance)
    np.testing.assert_allclose(found.std, values.std(axis=0), rtol=0, atol=tolerance)


def test_the_statistics_are_numpys_over_the_training_rows(rows) -> None:
    info = inspect_episodes(MIXED, normalize=("obs", "rewards", "returns"), gamma=GAMMA)
    _assert_stats_of(info.values.stats["obs"], rows["obs"])
    _assert_stats_of(info.values.stats["rewards"], rows["rewards"])
    _assert_stats_of(info.values.stats["returns"], rows["returns"])


def test_returns_wait_for_their_whole_episode_whatever_the_row_order() -> None:
    rng = np.random.default_rng(1)
    lengths = [5, 3, 7]
    episodes = np.repeat(np.arange(len(lengths)), lengths)
    steps = np.concatenate([np.arange(n) for n in lengths])
    rewards = rng.normal(size=len(steps))
    ends = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    expected = np.concatenate(
        [
            discounted_returns(rewards[episodes == e], np.zeros(1, np.int64), GAMMA)
            for e in (0, 1, 2)
        ]
    )
    shuffled = rng.permutation(len(steps))
    running = ReturnsAccumulator(GAMMA)
    for part in np.array_split(shuffled, 4):  # row groups holding parts of episodes
        running.add(episodes[part].astype(str), steps[part], rewards[part], ends[part])
    _assert_stats_of(running.result(), expected.astype(np.float32).astype(np.float64)[:, None])
    assert not running.waiting


def test_with_a_selection_only_the_kept_episodes_count(rows) -> None:
    where = EpisodeFilter((EpisodeCondition("behavior", "in", ("noisy_expert",)),))
    info = inspect_episodes(MIXED, normalize=("obs",), episodes_where=where)
    _assert_stats_of(info.values.stats["obs"], rows["obs"][rows["behavior"] == "noisy_expert"])


def test_row_groups_merge_to_the_statistics_of_all_rows_and_constants_get_std_one() -> None:
    values = np.random.default_rng(0).normal(3.0, 2.0, size=(1000, 3))
    values[:, 2] = 7.0  # a constant feature: divided by 1, not by 0
    running = StatsAccumulator()
    for part in np.array_split(values, 7):
        running.add(part)
    found = running.result()
    tolerance = len(values) * np.finfo(np.float64).eps * np.abs(values).max()
    np.testing.assert_allclose(found.mean, values.mean(axis=0), rtol=0, atol=tolerance)
    np.testing.assert_allclose(found.std[:2], values[:, :2].std(axis=0), rtol=0, atol=tolerance)
    assert found.std[2] == 1.0


def test_unchecked_values_give_no_statistics() -> None:
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(MIXED, normalize=("obs",), check_values="off")
    assert str(caught.value) == (
        "normalize ['obs']: statistics come from the float columns the value checks scan "
        "(obs, new_obs, actions, rewards; uint8 images are not standardised) and returns, "
        "with check_values full or sample, got check_values off; expected those columns and "
        "check_values full or sample"
    )
