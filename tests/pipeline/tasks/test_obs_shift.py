"""``tasks.shift_obs``: one random offset per task sample, added to groups of observation
features in obs and new_obs of its support and query; repeatable and resumable, in memory
and window by window."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from flows.config import ConfigError, load_config
from pipeline.contract.schema import DEFAULT_MODULE_ID
from pipeline.reads.episodes import inspect_episodes
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.obs_shift import ObsShift
from pipeline.tasks.options import TaskStream
from pipeline.tasks.samples import read_task_samples
from tests.helpers.episode_files import episode_table, tensor
from tests.helpers.paths import REPO

K, Q, OBS = 4, 6, 7
SIZES = {f"t{i:02d}": 20 + (7 * i) % 31 for i in range(24)}
SHIFT = ObsShift(((0, 1), (4, 5)), 0.25)
MOVED = [0, 1, 4, 5]
KEPT = [2, 3, 6]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Episodes of 5 rows sorted by task, in 3 files; ``rewards`` numbers the rows."""
    directory = tmp_path_factory.mktemp("shift")
    task_of = np.repeat(list(SIZES), list(SIZES.values()))
    sizes = list(SIZES.values())
    episode = np.concatenate([np.arange(n) // 5 + 100 * i for i, n in enumerate(sizes)])
    step = np.concatenate([np.arange(n) % 5 for n in sizes])
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(len(task_of), OBS))
    for part, rows in enumerate(np.array_split(np.arange(len(task_of)), 3)):
        table = episode_table(
            len(rows),
            obs_dim=OBS,
            action_dim=None,
            seed=part,
            eps_id=pa.array(episode[rows], pa.int64()),
            t=pa.array(step[rows], pa.int32()),
            obs=tensor(obs[rows]),
            new_obs=tensor(obs[rows] + 1.0),
            rewards=pa.array(rows.astype(np.float32)),
            task_id=pa.array(task_of[rows]).dictionary_encode(),
            terminateds=pa.array(np.zeros(len(rows), bool)),
        )
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=16)
    return directory, obs


def _samples(directory, mode):
    options = {"mode": "stream", "memory_budget_mb": 0.05} if mode == "windows" else {}
    return read_task_samples(inspect_episodes(directory), support=K, query=Q, **options)


def _take(samples, count, *, shift, seed=0, state=None):
    [stream] = split_for_learners(TaskStream(samples, shift=shift), 1, minibatch_size=4, seed=seed)
    with stream:
        if state is not None:
            stream.restore(state)
        batches = [batch for _ in range(count) for batch in stream.take(1)]
        return batches, stream.state()


def _part(batch, part):
    return batch[part][DEFAULT_MODULE_ID]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["memory", "windows"])
def test_each_sample_is_moved_by_one_offset_in_its_support_and_query(data, mode):
    directory, obs = data
    samples = _samples(directory, mode)
    plain, _ = _take(samples, 12, shift=None)
    shifted, _ = _take(samples, 12, shift=SHIFT)
    offsets = []
    for before, after in zip(plain, shifted, strict=True):
        rows = {p: _part(after, p)["rewards"].numpy().astype(int) for p in ("support", "query")}
        for part in ("support", "query"):
            assert torch.equal(_part(before, part)["rewards"], _part(after, part)["rewards"])
            for name in ("obs", "new_obs"):
                recorded = obs[rows[part]] + (name == "new_obs")
                moved = _part(after, part)[name].numpy().astype(np.float64) - recorded
                eps = np.finfo(np.float32).eps * 8  # float32 storage of values below ~4
                np.testing.assert_allclose(moved[..., KEPT], 0.0, atol=eps)
                # One offset per sample: the same in every row, group, part and column.
                per_sample = moved[:, :1, :2]
                np.testing.assert_allclose(
                    moved[..., :2], np.broadcast_to(per_sample, moved[..., :2].shape), atol=eps
                )
                np.testing.assert_allclose(moved[..., 4:6], moved[..., :2], atol=eps)
                if part == "support" and name == "obs":
                    offsets.append(per_sample[:, 0])
                    support_offsets = per_sample
                else:
                    np.testing.assert_allclose(per_sample, support_offsets, atol=eps)
    drawn = np.concatenate(offsets)
    assert np.abs(drawn).max() <= SHIFT.scale
    assert len(np.unique(drawn[:, 0])) == len(drawn)  # a fresh offset per sample
    assert drawn.std() > SHIFT.scale / 4


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["memory", "windows"])
def test_a_shifted_stream_repeats_and_resumes_exactly(data, mode):
    samples = _samples(data[0], mode)
    # 18 meta-batches per epoch: 15 and 20 cross into the next epoch.
    uninterrupted, _ = _take(samples, 24, shift=SHIFT, seed=3)
    again, _ = _take(samples, 24, shift=SHIFT, seed=3)
    _, state = _take(samples, 15, shift=SHIFT, seed=3)
    resumed, _ = _take(samples, 9, shift=SHIFT, seed=3, state=state)
    other_seed, _ = _take(samples, 1, shift=SHIFT, seed=4)
    for got, expected in ((again, uninterrupted), (resumed, uninterrupted[15:])):
        for a, b in zip(got, expected, strict=True):
            for part in ("support", "query"):
                assert torch.equal(_part(a, part)["obs"], _part(b, part)["obs"])
    assert not torch.equal(
        _part(other_seed[0], "query")["obs"], _part(uninterrupted[0], "query")["obs"]
    )


@pytest.mark.timeout(60)
def test_a_state_saved_with_another_shift_is_refused(data):
    samples = _samples(data[0], "memory")
    _, state = _take(samples, 2, shift=SHIFT)
    [stream] = split_for_learners(TaskStream(samples), 1, minibatch_size=4)
    with stream, pytest.raises(ValueError) as caught:
        stream.restore(state)
    assert str(caught.value) == (
        "learner-0: state was saved with shift={'groups': [[0, 1], [4, 5]], 'scale': 0.25} "
        "but this stream has none; build the streams with the saved settings"
    )
    [stream] = split_for_learners(
        TaskStream(samples, shift=ObsShift(((0, 1), (4, 5)), 0.5)), 1, minibatch_size=4
    )
    with stream, pytest.raises(ValueError) as caught:
        stream.restore(state)
    assert "but this stream has shift={'groups': [[0, 1], [4, 5]], 'scale': 0.5}" in str(
        caught.value
    )


@pytest.mark.parametrize(
    ("groups", "scale", "message"),
    [
        (
            ((0, 1), (4,)),
            0.1,
            "every group must have as many features as the first (2), got [[0, 1], [4]]",
        ),
        (((0, 1), (1, 2)), 0.1, "feature indices must be distinct and >= 0, got [0, 1, 1, 2]"),
        (((0,),), 0.0, "scale must be > 0, got 0.0"),
        ((), 0.1, "groups must hold at least one group of feature indices"),
    ],
)
def test_a_malformed_shift_is_refused_in_one_line(groups, scale, message):
    with pytest.raises(ValueError) as caught:
        ObsShift(groups, scale)
    assert str(caught.value) == message


@pytest.mark.timeout(60)
def test_features_outside_the_observation_are_refused(data):
    samples = _samples(data[0], "memory")
    with pytest.raises(ValueError) as caught:
        split_for_learners(TaskStream(samples, shift=ObsShift(((5, 7),), 0.1)), 1, minibatch_size=4)
    assert str(caught.value) == (
        "tasks.shift_obs.features: feature 7 is outside the observation's 7 features"
    )


@pytest.mark.parametrize(
    ("override", "line"),
    [
        (
            "tasks.shift_obs.features=[[0, 1], [2]]",
            "tasks.shift_obs: every group must have as many features as the first (2), got "
            "[[0, 1], [2]]",
        ),
        (
            "tasks.shift_obs.scale=0",
            "tasks.shift_obs.scale: Input should be greater than 0 (got 0)",
        ),
    ],
)
def test_a_malformed_shift_in_a_config_is_refused_naming_the_key(override, line):
    reach = REPO / "flows" / "configs" / "metaworld_reach.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(reach, [override])
    assert str(caught.value) == f"invalid config {reach} (1 error):\n  {line}"


@pytest.mark.parametrize("groups", [((0, 1), (4, 5)), ((1, 0), (5, 3)), ((2,), (0,))])
def test_apply_adds_each_offset_to_its_features_in_any_order_of_indices(groups) -> None:
    shift = ObsShift(groups, 1.0)
    obs = torch.arange(2 * 3 * 6, dtype=torch.float32).reshape(2, 3, 6)
    offsets = np.array([[10.0, 20.0], [30.0, 40.0]])[:, : shift.width]
    expected = obs.clone()
    for sample in range(2):
        for group in groups:
            for coordinate, feature in enumerate(group):
                expected[sample, :, feature] += offsets[sample, coordinate]
    moved = {"obs": obs.clone()}
    shift.apply(moved, offsets)
    assert torch.equal(moved["obs"], expected)
