"""A run's reads take the run's ``data`` settings: ``data.check_values`` decides whether a
NaN reward is refused before anything starts, and box warnings reach the caller."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.stages.datasets import inspect_datasets, value_warnings
from pipeline.contract.schema import DatasetError
from tests.helpers.flow_runs import tiny_config, tiny_point_robot


def _nan_reward(split_dir) -> str:
    """Put a NaN in the first reward of the split's first file; returns that file's path."""
    path = sorted(split_dir.glob("*.parquet"))[0]
    table = pq.read_table(path)
    rewards = table["rewards"].to_numpy().copy()
    rewards[0] = np.nan
    index = table.schema.get_field_index("rewards")
    table = table.set_column(index, table.schema.field(index), pa.array(rewards, pa.float32()))
    pq.write_table(table, path)
    return str(path)


@pytest.fixture
def nan_data(tmp_path):
    data = tiny_point_robot(tmp_path / "data")
    return data, _nan_reward(data / "train")


def test_a_nan_reward_is_refused_before_the_run_starts(nan_data, tmp_path):
    data, path = nan_data
    with pytest.raises(DatasetError, match=r"column 'rewards' has non-finite values") as caught:
        inspect_datasets(tiny_config(data, tmp_path / "work"))
    assert str(caught.value).startswith(f"{path}: column 'rewards'")


def test_check_values_off_lets_the_run_read_it(nan_data, tmp_path):
    data, _ = nan_data
    cfg = tiny_config(data, tmp_path / "work", ["data.check_values=off"])
    train, heldout = inspect_datasets(cfg)
    assert train.values.check_values == "off" and train.values.rows == 0
    assert value_warnings(train, heldout) == []


def test_check_values_off_as_yaml_reads_it(tmp_path):
    data = tiny_point_robot(tmp_path / "data")
    # `off` unquoted is YAML 1.1's false, in a file as in --set.
    assert tiny_config(data, tmp_path, ["data.check_values=off"]).data.check_values == "off"
    with pytest.raises(Exception, match=r"data.check_values: Input should be 'full', 'sample'"):
        tiny_config(data, tmp_path, ["data.check_values=on"])
