"""Support sets made of episodes: E whole episodes (or W-step windows of them) per sample,
the query set from the task's other episodes.

Every row's ``rewards`` is its global row index, so each sample can be traced back to the
episodes it used. Files are read with pyarrow (``read_task_samples``): no Ray.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.contract.schema import DEFAULT_MODULE_ID, DatasetError
from pipeline.reads.episodes import inspect_episodes
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.episodes import (
    EpisodeRows,
    EpisodeSupport,
    group_samples,
    plan_episode_samples,
)
from pipeline.tasks.options import TaskStream
from pipeline.tasks.samples import read_task_samples
from tests.helpers.episode_files import episode_table

# Episodes per task, each a length: two tasks of fixed 6-step episodes, one longer.
EPISODES = {"a": [6, 6, 6, 6, 6], "b": [6, 6, 6, 6], "c": [6, 6, 6, 6, 6, 6, 6]}
Q = 5


def _write(directory, episodes, *, files=2, row_group_size=8):
    """The episodes, sorted by (task, episode, t), cut into ``files`` files."""
    lengths = [n for task in episodes.values() for n in task]
    task_of = np.repeat([t for t, task in episodes.items() for _ in task], lengths)
    eps = np.repeat(np.arange(len(lengths)), lengths)
    step = np.concatenate([np.arange(n) for n in lengths])
    ends = np.zeros(len(eps), bool)
    ends[np.cumsum(lengths) - 1] = True
    directory.mkdir(parents=True, exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(len(eps)), files)):
        table = episode_table(
            len(rows),
            action_dim=None,
            seed=part,
            eps_id=pa.array(eps[rows], pa.int64()),
            t=pa.array(step[rows], pa.int32()),
            rewards=pa.array(rows.astype(np.float32)),
            task_id=pa.array(task_of[rows]).dictionary_encode(),
            terminateds=pa.array(ends[rows]),
        )
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=row_group_size)
    return eps, task_of


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    directory = tmp_path_factory.mktemp("episodes")
    eps, task_of = _write(directory, EPISODES)
    return inspect_episodes(directory), eps, task_of


def _samples(info, support, mode="memory", **options):
    budget = {"memory_budget_mb": 0.008} if mode == "stream" else {}
    return read_task_samples(info, query=Q, episode_support=support, mode=mode, **budget, **options)


def _take(samples, count, *, state=None, minibatch_size=2):
    [stream] = split_for_learners(samples, 1, minibatch_size=minibatch_size, seed=3)
    with stream:
        if state is not None:
            stream.restore(state)
        return list(stream.take(count)), stream.state()


def _rows(meta, part):
    return meta[part][DEFAULT_MODULE_ID]["rewards"].numpy().astype(int)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["memory", "stream"])
@pytest.mark.parametrize("window", [None, 4])
def test_supports_are_whole_episodes_or_windows_and_queries_come_from_other_episodes(
    data, mode, window
):
    info, eps, task_of = data
    samples = _samples(info, EpisodeSupport(2, window=window), mode)
    steps = window or 6
    assert samples.support == 2 * steps and samples.samples_per_epoch == 2 + 2 + 3
    batches, _ = _take(samples, 3, minibatch_size=2)  # one epoch: 7 samples, 3 batches
    used = []
    for meta in batches:
        support, query = _rows(meta, "support"), _rows(meta, "query")
        assert support.shape == (2, 2 * steps) and query.shape == (2, Q)
        for s, q in zip(support, query, strict=True):
            pieces = s.reshape(2, steps)
            assert (np.diff(pieces, axis=1) == 1).all()  # consecutive steps
            assert all(len(set(eps[p])) == 1 for p in pieces)  # each of one episode
            if window is None:
                assert all(p[0] == 0 or eps[p[0] - 1] != eps[p[0]] for p in pieces)
            assert not set(eps[s]) & set(eps[q]) and len(set(q)) == Q
            assert len(set(task_of[np.concatenate([s, q])])) == 1
            used.extend(set(eps[s]))
    assert len(used) == len(set(used)) == 12  # an episode is support once per epoch


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=7), min_size=1, max_size=5),
    e=st.integers(1, 3),
    window=st.one_of(st.none(), st.integers(1, 5)),
    query=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
)
def test_support_and_query_never_share_an_episode(lengths, e, window, query, seed):
    if window is None:  # whole episodes have one length: the first one drawn
        lengths = [[lengths[0][0]] * len(task) for task in lengths]
    flat = np.array([n for task in lengths for n in task])
    found = EpisodeRows(
        np.concatenate(([0], np.cumsum(flat)[:-1])),
        flat,
        np.repeat(np.arange(len(lengths)), [len(task) for task in lengths]),
    )
    offsets = np.concatenate(([0], np.cumsum([sum(task) for task in lengths])))
    support = EpisodeSupport(e, window=window)
    steps = window or lengths[0][0]
    samples, _ = group_samples(support, found, np.diff(offsets), query)
    rows, sample_group = plan_episode_samples(
        np.random.default_rng(seed), support, steps, query, found, offsets, samples
    )
    episode_of = np.repeat(np.arange(len(flat)), flat)
    assert rows.shape == (samples.sum(), e * steps + query)
    for row, g in zip(rows, sample_group, strict=True):
        chosen, asked = row[: e * steps], row[e * steps :]
        assert not set(episode_of[chosen]) & set(episode_of[asked])
        assert len(set(episode_of[chosen])) == e and len(set(asked)) == query
        assert offsets[g] <= row.min() and row.max() < offsets[g + 1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("window", [None, 3])
def test_one_window_streams_exactly_the_in_memory_batches(data, window):
    info, _, _ = data
    support = EpisodeSupport(2, window=window)
    in_memory, _ = _take(_samples(info, support), 7)
    one_window = read_task_samples(
        info, query=Q, episode_support=support, mode="stream", memory_budget_mb=64
    )
    assert len(one_window.windows) == 1
    streamed, _ = _take(one_window, 7)
    for a, b in zip(in_memory, streamed, strict=True):
        for part in ("support", "query"):
            for name, tensor in a[part][DEFAULT_MODULE_ID].items():
                assert torch.equal(tensor, b[part][DEFAULT_MODULE_ID][name]), name


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["memory", "stream"])
@pytest.mark.parametrize("first", [1, 3, 5])
def test_an_episode_stream_resumes_exactly(data, mode, first):
    info, _, _ = data
    samples = _samples(info, EpisodeSupport(1, window=4), mode)
    uninterrupted, _ = _take(samples, first + 4)
    _, state = _take(samples, first)
    resumed, _ = _take(samples, 4, state=state)
    for a, b in zip(resumed, uninterrupted[first:], strict=True):
        assert torch.equal(_t(a, "support"), _t(b, "support"))
        assert torch.equal(_t(a, "query"), _t(b, "query"))


def _t(meta, part):
    return meta[part][DEFAULT_MODULE_ID]["rewards"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_a_task_with_too_few_episodes_is_refused_or_skipped(tmp_path, mode):
    _write(tmp_path, {"a": [6, 6, 6], "b": [6, 6], "c": [6, 6, 6]})
    info = inspect_episodes(tmp_path)
    with pytest.raises(DatasetError) as refused:
        _samples(info, EpisodeSupport(2), mode)
    assert str(refused.value) == (
        "task_samples: 1 of 3 tasks have too few episodes for support sets of 2 episodes and "
        "5 query transitions from other episodes: 'b' (2 of 2 episodes usable, 12 rows); "
        "expected at least 2 usable episodes per task and at least 5 rows outside its 2 "
        "longest. Lower episode_support or query, remove those tasks, or leave them out "
        "(skip_small_tasks=True)"
    )
    skipped = _samples(info, EpisodeSupport(2), mode, skip_small_tasks=True)
    assert skipped.skipped_tasks == {"b": 12} and skipped.task_ids == ("a", "c")


def test_whole_episodes_of_different_lengths_are_refused_naming_the_window(tmp_path):
    _write(tmp_path, {"a": [6, 4, 6], "b": [6, 6, 5]})
    info = inspect_episodes(tmp_path)
    with pytest.raises(DatasetError) as refused:
        _samples(info, EpisodeSupport(1))
    assert str(refused.value) == (
        "task_samples: whole episodes as support sets need every episode to have one length "
        "(vmap stacks them), but the episodes have 4 to 6 steps; take W consecutive steps of "
        "each support episode instead (tasks.support_window: W, or EpisodeSupport(window=W))"
    )
    windowed = _samples(info, EpisodeSupport(1, window=4))
    assert windowed.support == 4 and windowed.samples_per_epoch == 6


def test_episode_support_and_support_are_one_or_the_other(data):
    info, _, _ = data
    with pytest.raises(ValueError) as both:
        read_task_samples(info, support=4, query=Q, episode_support=EpisodeSupport(1))
    assert str(both.value) == (
        "support=4 counts transitions, episode_support=EpisodeSupport(episodes=1, window=None) "
        "episodes: pass one of the two"
    )
    with pytest.raises(ValueError) as bad:
        EpisodeSupport(0)
    assert str(bad.value) == "EpisodeSupport.episodes must be an int >= 1, got 0"


@pytest.mark.timeout(60)
def test_each_ray_train_rank_builds_its_own_share_of_what_one_learner_sees(data):
    # A Ray Train worker reads the files itself (read_task_samples) and builds only its own
    # rank's stream: ranks 0 and 1 with one task each are one learner's meta-batch of two.
    info, _, _ = data
    samples = _samples(info, EpisodeSupport(1, window=3))
    whole, _ = _take(samples, 3, minibatch_size=2)
    shares = []
    for rank in (0, 1):
        [stream] = split_for_learners(
            TaskStream(samples, ranks=[rank]), 2, minibatch_size=1, seed=3
        )
        with stream:
            shares.append(list(stream.take(3)))
    for step, meta in enumerate(whole):
        for part in ("support", "query"):
            joined = torch.cat([_t(shares[rank][step], part) for rank in (0, 1)])
            assert torch.equal(joined, _t(meta, part))


def _query_rows_one_draw_per_round(rng, query, episodes, chosen, group_offsets, sample_group):
    """The query draw as first written (one ``rng.random`` per round of Floyd's draw): what
    every epoch planned so far was drawn with, so its batches must not change."""
    base = group_offsets[sample_group]
    order = np.argsort(episodes.starts[chosen], axis=1)
    excluded_starts = np.take_along_axis(episodes.starts[chosen], order, axis=1) - base[:, None]
    excluded_lengths = np.take_along_axis(episodes.lengths[chosen], order, axis=1)
    others = np.diff(group_offsets)[sample_group] - excluded_lengths.sum(axis=1)
    picked = np.empty((len(chosen), query), dtype=np.int64)
    for i in range(query):
        top = others - query + i
        draw = np.floor(rng.random(len(chosen)) * (top + 1)).astype(np.int64)
        taken = (picked[:, :i] == draw[:, None]).any(axis=1)
        picked[:, i] = np.where(taken, top, draw)
    picked.sort(axis=1)
    for start, length in zip(excluded_starts.T, excluded_lengths.T, strict=True):
        picked += np.where(picked >= start[:, None], length[:, None], 0)
    return base[:, None] + picked


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 30), min_size=4, max_size=24),
    query=st.integers(1, 20),
    support=st.integers(1, 2),
    seed=st.integers(0, 2**32 - 1),
)
def test_query_rows_are_the_draw_of_one_random_call_per_round(lengths, query, support, seed):
    from pipeline.tasks.episodes import EpisodeRows, _query_rows

    lengths = np.array(lengths)
    groups = 2
    group = np.arange(len(lengths)) % groups
    order = np.argsort(group, kind="stable")
    lengths, group = lengths[order], group[order]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    group_offsets = np.concatenate(([0], np.cumsum(np.bincount(group, weights=lengths)))).astype(
        int
    )
    episodes = EpisodeRows(starts, lengths, group)
    # Every group's first `support` episodes as one sample's support, when the rest can give Q.
    chosen, sample_group = [], []
    for g in range(groups):
        mine = np.flatnonzero(group == g)[:support]
        if len(mine) == support and lengths[group == g].sum() - lengths[mine].sum() >= query:
            chosen.append(mine)
            sample_group.append(g)
    if not chosen:
        return
    chosen, sample_group = np.array(chosen), np.array(sample_group)
    expected = _query_rows_one_draw_per_round(
        np.random.default_rng(seed), query, episodes, chosen, group_offsets, sample_group
    )
    found = _query_rows(
        np.random.default_rng(seed), query, episodes, chosen, group_offsets, sample_group
    )
    np.testing.assert_array_equal(found, expected)
