"""Returns at ingest: the vectorised return-to-go against a plain loop, across episode
boundaries, truncation, several tasks per file and episodes split over files, in task samples
and row streams; bad requests refused with what was expected."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contract.schema import DEFAULT_MODULE_ID, DatasetError
from pipeline.reads.episodes import read_episodes
from pipeline.reads.returns import (
    ReturnsIndex,
    discounted_returns,
    returns_columns,
    split_derived,
)
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.samples import task_samples
from tests.helpers.episode_files import episode_table, write
from tests.helpers.tolerances import rounding_tolerance

GAMMA = 0.9


def _loop_returns(rewards, episodes, terminated_last, gamma):
    """The plain loop: walk each episode backwards, G = r + gamma * G, reset between
    episodes. Returns (returns, truncated flags) per row."""
    returns = np.zeros(len(rewards))
    flags = np.zeros(len(rewards), bool)
    for episode in dict.fromkeys(episodes):
        rows = [i for i in range(len(rewards)) if episodes[i] == episode]
        total = 0.0
        for i in reversed(rows):
            total = float(rewards[i]) + gamma * total
            returns[i] = total
            flags[i] = not terminated_last[episode]
    return returns, flags


def _tolerance(rewards, lengths, gamma) -> float:
    # Both sum at most the longest episode's rewards, each scaled by a product of at most
    # that many gammas (<= 1): one rounded multiply and add per term, and the scan's
    # ceil(log2(length)) doublings of the discount: 2 * length + log2(length) + 1 operations
    # on sums no larger than length * max|reward|.
    longest = int(max(lengths))
    ops = 2 * longest + int(np.ceil(np.log2(longest))) + 1
    return rounding_tolerance(np.float64, magnitude=longest * np.abs(rewards).max(), ops=ops)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 0.99, 1.0])
def test_scan_matches_the_plain_loop_across_episode_boundaries(gamma):
    rng = np.random.default_rng(0)
    lengths = np.array([1, 2, 3, 7, 8, 9, 16, 17, 33, 1, 100])
    rewards = rng.normal(size=lengths.sum())
    episodes = np.repeat(np.arange(len(lengths)), lengths)
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    expected, _ = _loop_returns(rewards, episodes, dict.fromkeys(range(len(lengths)), True), gamma)
    got = discounted_returns(rewards, starts, gamma)
    np.testing.assert_allclose(got, expected, rtol=0, atol=_tolerance(rewards, lengths, gamma))
    # A row's return never reads past its episode: the last row is its own reward.
    ends = np.cumsum(lengths) - 1
    assert np.array_equal(got[ends], rewards[ends])


def test_columns_flag_every_row_of_an_episode_that_did_not_terminate():
    # eps 7: terminated; eps 3: truncated; eps 5: the recording stops without a flag.
    eps = [7, 7, 7, 3, 3, 5, 5, 5, 5]
    terminated = [False, False, True, False, False, False, False, False, False]
    truncated = [False, False, False, False, True, False, False, False, False]
    rewards = np.arange(1, 10, dtype=np.float32)
    table = pa.table(
        {
            "eps_id": pa.array(eps, pa.int64()),
            "t": pa.array([0, 1, 2, 0, 1, 0, 1, 2, 3], pa.int32()),
            "rewards": pa.array(rewards),
            "terminateds": pa.array(terminated),
            "truncateds": pa.array(truncated),
        }
    )
    columns = returns_columns(table, GAMMA)
    expected, flags = _loop_returns(rewards, eps, {7: True, 3: False, 5: False}, GAMMA)
    assert columns["returns"].dtype == np.float32
    np.testing.assert_array_equal(columns["returns"], expected.astype(np.float32))
    assert columns["returns_truncated"].tolist() == flags.tolist()
    assert flags.tolist() == [False] * 3 + [True] * 6


def _dataset(directory, *, files=3, seed=0):
    """Four tasks of six episodes of varied length, every file holding rows of several
    tasks, one episode in two halves in two files, ends alternating terminated/truncated."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=24)
    eps = np.repeat(np.arange(100, 124), lengths)
    t = np.concatenate([np.arange(n) for n in lengths])
    last = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    terminated = last & (eps % 2 == 0)
    table = episode_table(
        len(eps),
        eps_id=pa.array(eps, pa.int64()),
        t=pa.array(t, pa.int32()),
        rewards=pa.array(rng.normal(size=len(eps)).astype(np.float32)),
        terminateds=pa.array(terminated),
        truncateds=pa.array(last & ~terminated),
        task_id=pa.array([f"task{(e - 100) % 4}" for e in eps]).dictionary_encode(),
    )
    # Rows dealt to files by episode, except the longest episode, cut across two files.
    split = int(np.argmax(lengths)) + 100
    owner = (eps - 100) % files
    rows = np.arange(len(eps))
    first_half = (eps == split) & (t < lengths[split - 100] // 2)
    owner = np.where(eps == split, np.where(first_half, 0, 1), owner)
    for part in range(files):
        picked = rows[owner == part][::-1]  # reversed: nothing relies on order on disk
        write(directory / f"part-{part}.parquet", table.take(pa.array(picked)))
    expected, flags = _loop_returns(
        np.asarray(table.column("rewards")),
        eps,
        {e: bool(terminated[eps == e].any()) for e in np.unique(eps)},
        GAMMA,
    )
    return {(int(e), int(s)): (r, f) for e, s, r, f in zip(eps, t, expected, flags, strict=True)}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, ray_session):
    directory = tmp_path_factory.mktemp("returns")
    expected = _dataset(directory)
    return read_episodes(directory), expected


def _check_rows(eps, t, returns, flags, expected):
    for e, s, r, f in zip(eps.tolist(), t.tolist(), returns.tolist(), flags.tolist(), strict=True):
        want, truncated = expected[(e, s)]
        # Stored as float32: the loop's float64 value and the scan's (equal up to float64
        # rounding) each round once to float32, at most one float32 step apart.
        atol = rounding_tolerance(np.float32, magnitude=abs(want), ops=1)
        assert r == pytest.approx(want, rel=0, abs=atol), (e, s)
        assert bool(f) == bool(truncated), (e, s)


def test_task_samples_carry_returns_of_whole_episodes(dataset):
    episodes, expected = dataset
    samples = task_samples(
        episodes,
        support=2,
        query=2,
        columns=["eps_id", "t", "returns_truncated", "returns"],
        gamma=GAMMA,
    )
    assert samples.columns == ("eps_id", "t", "returns_truncated", "returns")
    arrays = samples.arrays
    assert len(arrays["returns"]) == len(expected)
    _check_rows(
        arrays["eps_id"], arrays["t"], arrays["returns"], arrays["returns_truncated"], expected
    )
    default = task_samples(episodes, support=2, query=2, gamma=GAMMA)
    assert default.columns[-2:] == ("returns", "returns_truncated")
    assert "returns" not in task_samples(episodes, support=2, query=2).columns


@pytest.mark.timeout(120)
def test_row_streams_look_returns_up_by_episode_and_step(dataset):
    episodes, expected = dataset
    rows = RowStream(episodes, columns=["eps_id", "t", "returns", "returns_truncated"], gamma=GAMMA)
    [stream] = split_for_learners(rows, 1, minibatch_size=8)
    with stream:
        batches = list(stream.take(len(expected) // 8))
    seen = set()
    for batch in batches:
        columns = batch[DEFAULT_MODULE_ID]
        _check_rows(
            columns["eps_id"].numpy(),
            columns["t"].numpy(),
            columns["returns"].numpy(),
            columns["returns_truncated"].numpy(),
            expected,
        )
        seen.update(zip(columns["eps_id"].tolist(), columns["t"].tolist(), strict=True))
    assert len(seen) == len(batches) * 8  # one epoch, no row twice


def test_string_episode_ids_and_unknown_rows():
    table = pa.table(
        {
            "eps_id": pa.array(["b", "a", "b", "a"]),
            "t": pa.array([1, 0, 0, 1], pa.int32()),
            "rewards": pa.array([1.0, 2.0, 3.0, 4.0], pa.float32()),
            "terminateds": pa.array([True, False, False, False]),
        }
    )
    index = ReturnsIndex(table, GAMMA)
    looked_up = index.add_to(table.select(["eps_id", "t"]), ["returns", "returns_truncated"])
    assert looked_up.column("returns").to_pylist() == pytest.approx(
        [1.0, 2.0 + GAMMA * 4.0, 3.0 + GAMMA * 1.0, 4.0], rel=1e-7
    )
    assert looked_up.column("returns_truncated").to_pylist() == [False, True, False, True]
    stranger = pa.table({"eps_id": pa.array(["c"]), "t": pa.array([0], pa.int32())})
    with pytest.raises(ValueError) as error:
        index.add_to(stranger, ["returns"])
    assert str(error.value) == (
        "returns: eps_id 'c' t 0 is not in the dataset the returns were derived from; "
        "expected the rows of the dataset as read (read it again after changing its files)"
    )


def test_bad_requests_are_refused():
    with pytest.raises(ValueError) as error:
        split_derived(["obs", "returns"], None)
    assert str(error.value) == (
        "columns ['returns'] are derived at ingest with a discount: pass gamma= "
        "(data.gamma in a run config)"
    )
    for gamma in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match=rf"gamma must be a number in \[0, 1\], got {gamma!r}"):
            split_derived(None, gamma)
    assert split_derived(["obs", "returns"], 0.9) == (["obs"], ("returns",))
    assert split_derived(None, 0.9) == (None, ("returns", "returns_truncated"))


def test_modules_sharing_an_episode_id_are_separate_episodes():
    # Two agents of one recording: both have eps_id 0, their rows contiguous per module.
    table = pa.table(
        {
            "module_id": pa.array(["a", "a", "b", "b"]),
            "eps_id": pa.array([0, 0, 0, 0], pa.int64()),
            "t": pa.array([0, 1, 0, 1], pa.int32()),
            "rewards": pa.array([1.0, 2.0, 3.0, 4.0], pa.float32()),
            "terminateds": pa.array([False, True, False, False]),
        }
    )
    derived = returns_columns(table, GAMMA)
    assert derived["returns"].tolist() == pytest.approx(
        [1.0 + GAMMA * 2.0, 2.0, 3.0 + GAMMA * 4.0, 4.0], rel=1e-7
    )
    assert derived["returns_truncated"].tolist() == [False, False, True, True]
    index = ReturnsIndex(table, GAMMA)
    shuffled = table.take(pa.array([3, 0, 2, 1]))
    looked_up = index.add_to(shuffled.select(["module_id", "eps_id", "t"]), ["returns"])
    assert looked_up.column("returns").to_pylist() == pytest.approx(
        derived["returns"][[3, 0, 2, 1]].tolist(), rel=1e-7
    )
    stranger = pa.table(
        {"module_id": ["c"], "eps_id": pa.array([0], pa.int64()), "t": pa.array([0], pa.int32())}
    )
    with pytest.raises(DatasetError) as error:
        index.add_to(stranger, ["returns"])
    assert str(error.value) == (
        "returns: module_id 'c' eps_id 0 t 0 is not in the dataset the returns were derived "
        "from; expected the rows of the dataset as read (read it again after changing its files)"
    )
    with pytest.raises(DatasetError) as error:
        ReturnsIndex(pa.concat_tables([table, table.slice(2, 1)]), GAMMA)
    assert str(error.value) == (
        "returns: module_id 'b' eps_id 0 t 0 is on more than one row; expected each step of "
        "an episode once (offmeta data validate names every repeated row)"
    )


@pytest.mark.timeout(120)
def test_row_streams_of_agents_sharing_episode_ids_get_each_agents_returns(tmp_path, ray_session):
    # Two agents recorded together: the same eps_id and t on both, different rewards.
    one = episode_table(12, episode_length=4, seed=1, module_id=pa.array(["a"] * 12))
    two = episode_table(12, episode_length=4, seed=2, module_id=pa.array(["b"] * 12))
    write(tmp_path / "a.parquet", one)
    write(tmp_path / "b.parquet", two)
    expected = {}
    for module, table in (("a", one), ("b", two)):
        eps = np.asarray(table.column("eps_id"))
        returns, _ = _loop_returns(
            np.asarray(table.column("rewards")), eps, dict.fromkeys(eps.tolist(), True), GAMMA
        )
        for e, s, r in zip(eps, np.asarray(table.column("t")), returns, strict=True):
            expected[(module, int(e), int(s))] = r
    rows = RowStream(read_episodes(tmp_path), columns=["eps_id", "t", "returns"], gamma=GAMMA)
    [stream] = split_for_learners(rows, 1, minibatch_size=4)
    seen = {}
    with stream:
        for batch in stream.take(6):
            for module, columns in batch.items():
                for e, s, r in zip(
                    columns["eps_id"].tolist(),
                    columns["t"].tolist(),
                    columns["returns"].tolist(),
                    strict=True,
                ):
                    seen[(module, e, s)] = r
    assert seen.keys() == expected.keys()
    for key, want in expected.items():
        atol = rounding_tolerance(np.float32, magnitude=abs(want), ops=1)
        assert seen[key] == pytest.approx(want, rel=0, abs=atol), key
