"""LearnerStream over row minibatches: exact counts, epochs, seeds, resume, concurrency.

Every row's ``rewards`` is its global row index, so batches can be traced to rows.
1000 rows, minibatches of 64 and super-batches of 256 rows: one learner gets
3 * 4 + 3 = 15 minibatches per epoch (the last super-batch has 232 rows) and 40 rows
are dropped.
"""

from __future__ import annotations

import dataclasses
import gc
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import read_episodes
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import LearnerStream, StreamStalledError, split_for_learners
from tests.helpers.episode_files import episode_table, tensor, write, write_two_agents

ROWS, MINIBATCH, SUPERBATCH = 1000, 64, 256
PER_EPOCH = 15
DROPPED = ROWS - PER_EPOCH * MINIBATCH


@pytest.fixture(scope="module")
def episodes(tmp_path_factory, ray_session):
    """Two agents, ``m0`` and ``m1``, each with a row for every step of every episode."""
    directory = tmp_path_factory.mktemp("rows")
    write_two_agents(directory, [0, 400, ROWS])
    return read_episodes(directory)


@pytest.fixture(scope="module")
def cached(episodes):
    """The same rows held in Ray's object store: an epoch costs ~0.1 s instead of ~1 s of
    Parquet planning and reading on this machine."""
    return dataclasses.replace(episodes, dataset=episodes.dataset.materialize())


def _streams(
    episodes, num_learners=1, *, minibatch_size=MINIBATCH, seed=0, stall_timeout_s=60.0, **rows
) -> list[LearnerStream]:
    """Streams of ``episodes``; ``rows`` are ``RowStream`` options."""
    return split_for_learners(
        RowStream(episodes, **{"superbatch_rows": SUPERBATCH, **rows}),
        num_learners,
        minibatch_size=minibatch_size,
        seed=seed,
        stall_timeout_s=stall_timeout_s,
    )


def _ids(batch) -> np.ndarray:
    return np.concatenate([columns["rewards"].numpy() for columns in batch.values()]).astype(int)


def _take_ids(stream: LearnerStream, num_iters: int) -> list[np.ndarray]:
    return [_ids(batch) for batch in stream.take(num_iters)]


def _producer_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("offmeta-stream-")]


def _in_threads(
    streams: list[LearnerStream], work: Callable[[LearnerStream], Any], timeout_s: float
) -> tuple[dict[str, Any], list[BaseException], bool]:
    """``work(stream)`` for every stream in a thread of its own: the results by learner,
    the errors raised, and whether every thread ended within ``timeout_s``."""
    results: dict[str, Any] = {}
    errors: list[BaseException] = []

    def run(stream: LearnerStream) -> None:
        try:
            results[stream.name] = work(stream)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(stream,)) for stream in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    return results, errors, not any(thread.is_alive() for thread in threads)


@pytest.mark.timeout(120)
def test_take_yields_exactly_num_iters_and_continues_where_it_stopped(cached):
    [pieces] = _streams(cached, seed=5)
    [whole] = _streams(cached, seed=5)
    [other_seed] = _streams(cached, seed=6)
    with pieces, whole, other_seed:
        first = _take_ids(pieces, 3)
        assert _take_ids(pieces, 0) == []
        second = _take_ids(pieces, 4)
        reference = _take_ids(whole, 7)
        different = _take_ids(other_seed, 7)

    assert len(first) == 3 and len(second) == 4
    assert all(len(ids) == MINIBATCH for ids in first + second)
    assert all(np.array_equal(a, b) for a, b in zip(first + second, reference, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(reference, different, strict=True))
    assert pieces.state()["batches_consumed"] == 7


@pytest.mark.timeout(120)
def test_each_epoch_is_disjoint_complete_and_reshuffled(cached):
    [stream] = _streams(cached, seed=1)
    with stream:
        epochs = [np.concatenate(_take_ids(stream, PER_EPOCH)) for _ in range(2)]
        assert stream.state()["epoch"] == 0 + 1 and stream.state()["batches_consumed"] == 15
        next(stream.take(1))
        stats = stream.stats()

    for rows in epochs:
        assert len(rows) == PER_EPOCH * MINIBATCH
        assert len(np.unique(rows)) == len(rows)
        assert set(rows.tolist()) <= set(range(ROWS))
    assert not np.array_equal(epochs[0], epochs[1])
    assert stats["epochs_completed"] == 2 and stats["epoch"] == 2
    assert stats["dropped_rows"] == 2 * DROPPED
    assert stats["batches"] == 2 * PER_EPOCH + 1
    assert stats["rows"] == stats["batches"] * MINIBATCH


@pytest.mark.timeout(120)
def test_restore_resumes_with_identical_batches(episodes):
    # From the files: the Parquet read order must be deterministic too.
    [original] = _streams(episodes, seed=2)
    with original:
        _take_ids(original, PER_EPOCH + 5)
        saved = original.state()
        expected = _take_ids(original, 8)
    [resumed] = _streams(episodes, seed=2)
    with resumed:
        resumed.restore(saved)
        got = _take_ids(resumed, 8)

    assert saved["epoch"] == 1 and saved["batches_consumed"] == 5 and saved["exact"]
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.timeout(120)
def test_reading_a_file_per_window_gives_the_same_batches(episodes, monkeypatch):
    """Windows (pipeline.rows.read_ahead) decide when files are read, never the row order."""
    [one_window] = _streams(episodes, seed=4, cache_budget_mb=0)
    with one_window:
        expected = _take_ids(one_window, 2 * PER_EPOCH)
    monkeypatch.setattr("pipeline.rows.epoch_tables._WINDOW_BYTES", 1)
    [windowed] = _streams(episodes, seed=4, cache_budget_mb=0)
    with windowed:
        got = _take_ids(windowed, 2 * PER_EPOCH)

    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


@pytest.mark.timeout(120)
def test_a_resume_across_the_epoch_boundary_while_reading_ahead_is_exact(episodes, monkeypatch):
    """A file per window: when the state is saved, two minibatches before the end of epoch
    0, epoch 1's first window is already read ahead; state() counts taken batches only."""
    monkeypatch.setattr("pipeline.rows.epoch_tables._WINDOW_BYTES", 1)
    streams = _streams(episodes, 2, seed=6, cache_budget_mb=0)
    _lockstep(streams, PER_EPOCH // 2 - 2)
    saved = [stream.state() for stream in streams]
    expected = _lockstep(streams, 6)
    for stream in streams:
        stream.close()
    assert _stream_threads() == []
    resumed = _streams(episodes, 2, seed=6, cache_budget_mb=0)
    for stream, state in zip(resumed, saved, strict=True):
        stream.restore(state)
    got = _lockstep(resumed, 6)
    crossed = [stream.state() for stream in resumed]
    for stream in resumed:
        stream.close()

    assert [(s["epoch"], s["batches_consumed"]) for s in saved] == [(0, PER_EPOCH // 2 - 2)] * 2
    assert [(s["epoch"], s["batches_consumed"]) for s in crossed] == [(1, 4)] * 2
    for mine, theirs in zip(expected, got, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    assert _stream_threads() == []


def _lockstep(streams: list[LearnerStream], steps: int) -> list[list[np.ndarray]]:
    """A batch from every learner in turn (learners of one split consume together)."""
    taken: list[list[np.ndarray]] = [[] for _ in streams]
    for _ in range(steps):
        for mine, stream in zip(taken, streams, strict=True):
            mine += _take_ids(stream, 1)
    return taken


def _stream_threads() -> list[str]:
    """Producer and read-ahead threads: close() joins them (with timeouts)."""
    prefixes = ("offmeta-stream-", "offmeta-read-ahead")
    return [t.name for t in threading.enumerate() if t.name.startswith(prefixes)]


@pytest.mark.timeout(120)
def test_two_learners_resume_exactly_and_refuse_mismatched_epochs(cached):
    def lockstep(streams, steps):
        taken = [[] for _ in streams]
        for _ in range(steps):
            for mine, stream in zip(taken, streams, strict=True):
                mine += _take_ids(stream, 1)
        return taken

    original = _streams(cached, 2, seed=4)
    lockstep(original, 9)  # 7 rounds per epoch: two into epoch 1
    saved = [s.state() for s in original]
    expected = lockstep(original, 6)
    for stream in original:
        stream.close()
    resumed = _streams(cached, 2, seed=4)
    for stream, state in zip(resumed, saved, strict=True):
        stream.restore(state)
    got = lockstep(resumed, 6)
    for stream in resumed:
        stream.close()
    mismatched = _streams(cached, 2, seed=4)
    mismatched[0].restore({**saved[0], "epoch": 0})
    mismatched[1].restore(saved[1])

    assert [(s["epoch"], s["batches_consumed"], s["exact"]) for s in saved] == [(1, 2, True)] * 2
    for mine, theirs in zip(expected, got, strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(mine, theirs, strict=True))
    with pytest.raises(
        ValueError, match=r"restored to different epochs \(learner-0: 0, learner-1: 1\)"
    ):
        mismatched[1].take(1)
    for stream in mismatched:
        stream.close()


def test_restore_refuses_a_state_from_other_settings(cached):
    [stream] = _streams(cached, seed=3)
    with stream:
        state = stream.state()
        with pytest.raises(ValueError, match=r"state was saved with seed=3 but this stream has"):
            _streams(cached, seed=4)[0].restore(state)
        with pytest.raises(
            ValueError, match=r"learner-0: state has no 'rank'; expected state\(\) output"
        ):
            stream.restore({"epoch": 1})


@pytest.mark.timeout(120)
def test_two_learners_in_threads_advance_epochs_together(cached):
    streams = _streams(cached, 2, seed=0)
    # Each split holds 500 rows: super-batches of 256 + 244 give 4 + 3 minibatches.
    per_epoch = 7
    taken, errors, ended = _in_threads(streams, lambda s: _take_ids(s, 2 * per_epoch + 1), 90)
    states = [s.state() for s in streams]
    for stream in streams:
        stream.close()

    assert not errors and ended
    assert [(s["epoch"], s["batches_consumed"]) for s in states] == [(2, 1), (2, 1)]
    first_epoch = [np.concatenate(taken[name][:per_epoch]) for name in sorted(taken)]
    union = np.concatenate(first_epoch)
    assert len(union) == 2 * per_epoch * MINIBATCH
    assert len(np.unique(union)) == len(union)


@pytest.mark.timeout(60)
def test_a_stalled_learner_fails_the_others_within_the_timeout(cached):
    streams = _streams(cached, 2, stall_timeout_s=1.0)
    started = time.monotonic()
    _, caught, ended = _in_threads(streams[:1], lambda s: _take_ids(s, 10 * 7), 40)
    elapsed = time.monotonic() - started

    assert ended, f"learner-0 still waiting after {elapsed:.1f} s"
    assert len(caught) == 1 and isinstance(caught[0], StreamStalledError)
    assert "learner stream stalled: learner-1 (" in str(caught[0])
    assert "took no batch for longer than stall_timeout_s=1 s" in str(caught[0])
    with pytest.raises(StreamStalledError, match=r"learner-1 \("):
        next(streams[1].take(1))
    for stream in streams:
        stream.close()
    assert _producer_threads() == []


@pytest.mark.timeout(120)
def test_one_live_generator_per_stream_and_close_stops_the_producer(cached):
    with _streams(cached)[0] as stream:
        live = stream.take(3)
        next(live)
        with pytest.raises(RuntimeError, match=r"learner-0: a take\(\) generator is still live"):
            stream.take(1)
        live.close()
        assert len(_take_ids(stream, 1)) == 1
        unstarted = stream.take(1)
        del unstarted
        gc.collect()
        assert len(_take_ids(stream, 1)) == 1
        assert stream.state()["batches_consumed"] == 3
        assert [t.name for t in _producer_threads()] == ["offmeta-stream-learner-0"]
    assert _producer_threads() == []
    with pytest.raises(RuntimeError, match=r"learner-0: the stream is closed"):
        stream.take(1)


@pytest.mark.timeout(120)
def test_an_empty_epoch_is_an_error_naming_the_learner(cached):
    [stream] = _streams(cached, minibatch_size=2048)
    with stream, pytest.raises(DatasetError) as caught:
        next(stream.take(1))
    assert str(caught.value) == (
        "learner-0: epoch 0 gave 1000 rows, fewer than one minibatch of 2048 (one for each "
        "learner); lower minibatch_size or num_learners, or add data"
    )


@pytest.mark.timeout(120)
def test_modules_to_update_and_columns_shape_every_minibatch(episodes):
    # Straight from the files, and materialized (reading only the selected columns).
    [stream] = _streams(
        episodes, modules_to_update=["m1"], columns=["obs", "rewards"], materialize=True
    )
    with stream:
        batches = list(stream.take(4))

    for batch in batches:
        assert list(batch) == ["m1"]
        assert set(batch["m1"]) == {"obs", "rewards"}
        ids = batch["m1"]["rewards"].numpy().astype(int)
        assert len(ids) == MINIBATCH and np.all(ids % 2 == 1)
        assert batch["m1"]["obs"].shape == (MINIBATCH, 3)


def test_bad_arguments_are_refused_before_anything_runs(cached):
    with pytest.raises(ValueError, match=r"modules_to_update names \['m9'\], which the data"):
        _streams(cached, modules_to_update=["m9"])
    with pytest.raises(ValueError, match=r"columns \['reward'\] are not in the data; available"):
        _streams(cached, columns=["reward"])
    with pytest.raises(ValueError, match=r"minibatch_size must be an int >= 1, got 0"):
        _streams(cached, minibatch_size=0)
    with pytest.raises(ValueError, match=r"superbatch_rows must be an int >= 1, got 0"):
        _streams(cached, superbatch_rows=0)
    # Row streams of one split are dealt from one read: they have no ranks= to give.
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'ranks'"):
        _streams(cached, 2, ranks=[1])
    with pytest.raises(TypeError) as refused:
        RowStream(cached.dataset, columns=["obs"])
    assert str(refused.value) == (
        "RowStream streams the rows of Episodes (read_episodes) or of a Ray DataIterator "
        "(one learner's shard), got MaterializedDataset; pass task samples to "
        "split_for_learners as they are (or in a TaskStream)"
    )
    with _streams(cached)[0] as stream, pytest.raises(ValueError, match=r"num_iters must be"):
        stream.take(-1)


def test_the_pipeline_package_exports_the_stream_names():
    import pipeline
    import pipeline.tasks.options

    assert pipeline.split_for_learners is split_for_learners
    assert (pipeline.LearnerStream, pipeline.StreamStalledError) == (
        LearnerStream,
        StreamStalledError,
    )
    assert pipeline.RowStream is RowStream
    assert pipeline.TaskStream is pipeline.tasks.options.TaskStream


@pytest.mark.timeout(120)
def test_columns_renamed_on_disk_arrive_under_canonical_names(tmp_path, ray_session):
    observations = np.arange(60, dtype=np.float32).reshape(20, 3)
    table = episode_table(20, action_dim=None, obs=None, observation=tensor(observations))
    write(tmp_path / "part-0.parquet", table)
    episodes = read_episodes(tmp_path, column_map={"obs": "observation"})

    [stream] = split_for_learners(RowStream(episodes, columns=["obs", "t"]), 1, minibatch_size=20)
    with stream:
        batch = next(stream.take(1))["default_policy"]

    assert sorted(batch["obs"][:, 0].tolist()) == observations[:, 0].tolist()
    assert batch["t"].dtype == torch.int32


def test_a_file_removed_after_validation_is_refused_by_name(tmp_path, ray_session):
    for part in range(2):
        table = episode_table(100, action_dim=None, first_episode=34 * part)
        write(tmp_path / f"part-{part}.parquet", table)
    episodes = read_episodes(tmp_path)
    (tmp_path / "part-1.parquet").unlink()

    with pytest.raises(DatasetError) as refused:
        split_for_learners(episodes, 1, minibatch_size=10)
    assert str(refused.value) == (
        f"{tmp_path / 'part-1.parquet'}: no longer a file; expected the files that "
        "read_episodes validated (read the dataset again after changing it)"
    )


@pytest.mark.timeout(120)
def test_a_file_broken_after_validation_fails_every_learner(tmp_path, ray_session):
    """A read that fails mid-epoch reaches the learners as an error, never a hang."""
    for part in range(3):
        table = episode_table(100, action_dim=None, first_episode=34 * part)
        write(tmp_path / f"part-{part}.parquet", table)
    episodes = read_episodes(tmp_path)
    (tmp_path / "part-1.parquet").write_bytes(b"not parquet any more")
    streams = split_for_learners(episodes, 2, minibatch_size=10)
    _, errors, ended = _in_threads(streams, lambda s: _take_ids(s, 100), 60)
    for stream in streams:
        stream.close()

    assert ended
    assert len(errors) == 2
    assert all("part-1.parquet" in str(error) for error in errors), errors


@pytest.mark.timeout(120)
def test_a_ray_data_iterator_shard_is_a_source(episodes):
    shard = RowStream(episodes.dataset.iterator(), superbatch_rows=SUPERBATCH)
    [stream] = split_for_learners(shard, 1, minibatch_size=MINIBATCH)
    with stream:
        batches = _take_ids(stream, 3)
    assert [len(ids) for ids in batches] == [MINIBATCH] * 3
    assert stream.state()["exact"] is False
