"""read_episodes end to end: the Ray Dataset holds the validated files, canonical names
and canonical types (numpy batches of tensors are float32 arrays, never object arrays)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.reads.episodes import Episodes, inspect_episodes, read_episodes
from tests.helpers.episode_files import episode_table, fixed_list, write


def _all_rows(episodes: Episodes, batch_format: str) -> list:
    return list(episodes.dataset.iter_batches(batch_format=batch_format, batch_size=None))


def test_canonical_files_give_float32_tensor_batches(tmp_path, ray_session):
    first = episode_table(6, seed=1)
    second = episode_table(3, seed=2, eps_id=pa.array([7, 7, 7]))
    write(tmp_path / "part-0.parquet", first)
    write(tmp_path / "part-1.parquet", second)

    episodes = read_episodes(tmp_path)

    assert episodes.num_rows == 9
    assert episodes.files == (str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet"))
    numpy_batches = _all_rows(episodes, "numpy")
    obs = np.concatenate([b["obs"] for b in numpy_batches])
    actions = np.concatenate([b["actions"] for b in numpy_batches])
    assert obs.dtype == np.float32 and obs.shape == (9, 3)
    assert actions.dtype == np.float32 and actions.shape == (9, 2)
    expected = np.concatenate(
        [t.column("obs").combine_chunks().to_numpy_ndarray() for t in (first, second)]
    )
    np.testing.assert_array_equal(np.sort(obs, axis=0), np.sort(expected, axis=0))
    arrow_batch = _all_rows(episodes, "pyarrow")[0]
    assert arrow_batch.schema.field("obs").type == pa.fixed_shape_tensor(pa.float32(), [3])
    assert arrow_batch.schema.field("t").type == pa.int32()


def test_column_map_and_non_canonical_types_are_normalised(tmp_path, ray_session):
    rng = np.random.default_rng(0)
    table = episode_table(
        4,
        obs=None,
        t=None,
        actions=None,
        observation=fixed_list(rng.normal(size=(4, 5))),
        step=pa.array([0, 1, 2, 0], pa.int64()),
        act=pa.array([0, 3, 1, 2], pa.int64()),
    )
    write(tmp_path / "data.parquet", table)

    episodes = read_episodes(
        tmp_path / "data.parquet", column_map={"obs": "observation", "t": "step", "actions": "act"}
    )

    assert episodes.schema.obs_shape == (5,)
    assert episodes.schema.discrete_actions and episodes.schema.action_shape == ()
    (batch,) = _all_rows(episodes, "numpy")
    assert batch["obs"].dtype == np.float32 and batch["obs"].shape == (4, 5)
    np.testing.assert_array_equal(batch["t"], np.array([0, 1, 2, 0], np.int32))
    assert batch["t"].dtype == np.int32
    np.testing.assert_array_equal(batch["actions"], [0, 3, 1, 2])
    (arrow,) = _all_rows(episodes, "pyarrow")
    assert "observation" not in arrow.column_names and "step" not in arrow.column_names
    assert arrow.schema.field("obs").type == pa.fixed_shape_tensor(pa.float32(), [5])


def test_inspect_and_read_agree(tmp_path, ray_session):
    write(tmp_path / "x" / "a.parquet", episode_table(6))
    write(tmp_path / "x" / "b.parquet", episode_table(6, seed=3, first_episode=2))
    pattern = str(tmp_path / "x" / "*.parquet")

    info = inspect_episodes(pattern)
    episodes = read_episodes([tmp_path / "x" / "a.parquet", tmp_path / "x" / "b.parquet"])

    assert episodes.summary() == info.summary()
    assert episodes.dataset.count() == 12


@pytest.mark.parametrize("action_dim", [None, 1])
def test_summary_counts_without_ray(tmp_path, action_dim):
    table = episode_table(12, episode_length=4, tasks=("t0", "t1", "t2"), action_dim=action_dim)
    write(tmp_path / "d" / "part.parquet", table.append_column("module_id", pa.array(["m"] * 12)))

    summary = inspect_episodes(tmp_path / "d").summary()

    fingerprint = summary.pop("fingerprint")
    assert len(fingerprint) == 64
    assert summary == {
        "id": None,
        "split": None,
        "root": str(tmp_path / "d"),
        "files": 1,
        "rows": 12,
        "episodes": 3,
        "tasks": 3,
        "modules": ["m"],
        "obs_shape": [3],
        "action_shape": [] if action_dim is None else [1],
        "discrete_actions": action_dim is None,
    }
