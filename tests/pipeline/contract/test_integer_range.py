"""Integers are never read into a narrower type than they hold unless every value fits: an
int64 ``t`` outside int32 is refused at validation, and every integer cast the reads and
importers make refuses a value that does not fit, naming the file, the column and the first
such value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.contract.integer_range import fitting_cast
from pipeline.contract.schema import DatasetError
from pipeline.importers.columns import to_tensor
from pipeline.reads.episodes import inspect_episodes
from pipeline.tasks.samples import task_samples
from tests.helpers.episode_files import episode_table

BEYOND_INT32 = 2**31


def _steps_file(directory, first_step: int, statistics: bool = True) -> str:
    """Two episodes of 3 steps, the second starting at ``first_step`` (int64 ``t``)."""
    directory.mkdir(exist_ok=True)
    steps = np.r_[0, 1, 2, first_step, first_step + 1, first_step + 2]
    table = episode_table(t=pa.array(steps, pa.int64()))
    path = directory / "part.parquet"
    pq.write_table(table, path, row_group_size=2, write_statistics=statistics)
    return str(path)


@pytest.mark.parametrize("statistics", [True, False], ids=["statistics", "read"])
def test_an_int64_step_outside_int32_is_refused_at_validation(tmp_path, statistics):
    """Partial episodes may start anywhere; reads hold ``t`` as int32."""
    path = _steps_file(tmp_path, BEYOND_INT32 - 1, statistics)
    with pytest.raises(DatasetError) as refused:
        inspect_episodes(tmp_path, allow_partial_episodes=True)
    assert str(refused.value) == (
        f"{path}: column 't' holds {BEYOND_INT32} at eps_id 1, which does not fit int32, the "
        "type reads hold steps in; expected steps in [-2147483648, 2147483647]. Fix: number "
        "each episode's steps from 0"
    )


def test_int64_steps_that_fit_are_read_as_int32(tmp_path):
    _steps_file(tmp_path, BEYOND_INT32 - 3, statistics=False)
    info = inspect_episodes(tmp_path, allow_partial_episodes=True)
    windows = task_samples(
        info, support=1, query=1, columns=["t"], mode="stream", memory_budget_mb=1
    )
    steps = np.concatenate(
        [windows.read_window(i).arrays["t"] for i in range(len(windows.windows))]
    )
    assert steps.dtype == np.int32
    assert sorted(steps.tolist()) == [0, 1, 2, BEYOND_INT32 - 3, BEYOND_INT32 - 2, BEYOND_INT32 - 1]


@pytest.mark.parametrize(
    ("values", "source", "target", "found", "expected"),
    [
        (
            [3, 2**63, 2**64 - 1],
            pa.uint64(),
            pa.int64(),
            2**63,
            "[-9223372036854775808, 9223372036854775807]",
        ),
        ([-5, 2**31], pa.int64(), pa.int32(), 2**31, "[-2147483648, 2147483647]"),
        ([0, -(2**24) - 1], pa.int64(), pa.float32(), -(2**24) - 1, "[-16777216, 16777216]"),
    ],
    ids=["uint64-int64", "int64-int32", "int64-float32"],
)
def test_a_narrowing_cast_refuses_the_first_value_that_does_not_fit(
    values, source, target, found, expected
):
    column = pa.chunked_array([pa.array(values[:1], source), pa.array(values[1:], source)])
    with pytest.raises(DatasetError) as refused:
        fitting_cast(column, target, where="rec/part-0.parquet", label="'actions'")
    name = {"float": "float32"}.get(str(target), str(target))
    assert str(refused.value) == (
        f"rec/part-0.parquet: column 'actions' holds {found} (row 1), which does not fit "
        f"{name}; expected values in {expected}. Fix: store the column in a type its values fit"
    )
    fitting = pa.chunked_array([pa.array(values[:1], source)])
    assert fitting_cast(fitting, target, where="", label="").equals(pc.cast(fitting, target))


def test_an_imported_integer_observation_that_float32_cannot_hold_is_refused():
    field = pa.field("obs", pa.int64())
    with pytest.raises(DatasetError) as refused:
        to_tensor(pa.array([1, 2**24 + 1], pa.int64()), field, where="rec/part-0.parquet")
    assert str(refused.value) == (
        "rec/part-0.parquet: column 'obs' holds 16777217 (row 1), which does not fit float32; "
        "expected values in [-16777216, 16777216]. Fix: store the column in a type its values "
        "fit"
    )
