"""Later epochs of a row stream served from memory (pipeline.rows.epoch_cache): the same batches
as re-reading the files every epoch, and a re-read, said in a log line, over the budget.

Every row's ``rewards`` is its global row index, so batches can be traced to rows: 1000
rows in three files, minibatches of 64, super-batches of 256 rows.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from pipeline.reads.episodes import read_episodes
from pipeline.rows.epoch_cache import FileTables
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import LearnerStream, split_for_learners
from pipeline.tasks.samples import task_samples
from tests.helpers.episode_files import write_two_agents

ROWS, MINIBATCH, SUPERBATCH = 1000, 64, 256
PER_EPOCH = 15  # one learner: 3 * 4 + 3 minibatches an epoch (the last super-batch: 232 rows)
LOGGER = "pipeline.rows.epoch_cache"


def _write_rows(directory: Path) -> Path:
    """Two agents, ``m0`` and ``m1``, in three files of unequal sizes."""
    return write_two_agents(directory, [0, 300, 700, ROWS])


def _streams(episodes, num_learners=1, **rows) -> list[LearnerStream]:
    """Streams of ``episodes`` (seed 3); ``rows`` are ``RowStream`` options."""
    rows = {"superbatch_rows": SUPERBATCH, **rows}
    return split_for_learners(
        RowStream(episodes, **rows), num_learners, minibatch_size=MINIBATCH, seed=3
    )


def _lockstep(streams: list[LearnerStream], steps: int) -> list[np.ndarray]:
    """A batch from every learner in turn, as row ids (learners of one split consume
    together)."""
    taken = []
    for _ in range(steps):
        for stream in streams:
            batch = next(stream.take(1))
            taken.append(np.concatenate([c["rewards"].numpy() for c in batch.values()]))
    return taken


def _count_windows(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The windows of files that streams read from now on, one entry each."""
    import pipeline.rows.epoch_tables

    read_window = pipeline.rows.epoch_tables.read_window
    built: list[object] = []

    def counted(*args, **kwargs):
        built.append(args[1])
        return read_window(*args, **kwargs)

    monkeypatch.setattr(pipeline.rows.epoch_tables, "read_window", counted)
    return built


def _break_files(directory: Path) -> None:
    for path in directory.glob("*.parquet"):
        path.write_bytes(b"not parquet any more")


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("modules", "per_epoch"),
    # Per learner: 15 minibatches an epoch dealt in rounds of two; m1's 500 rows give 7.
    [(None, 7), (["m1"], 3)],
)
def test_later_epochs_come_from_memory_with_the_batches_of_a_re_read(
    tmp_path, ray_session, caplog, monkeypatch, modules, per_epoch
):
    """Two learners, three epochs: the same batches as reading every epoch; once the first
    epoch is kept, the files are not read again (they are broken after it)."""
    episodes = read_episodes(_write_rows(tmp_path))
    re_read = _streams(episodes, 2, cache_budget_mb=0, modules_to_update=modules)
    expected = _lockstep(re_read, 3 * per_epoch)
    for stream in re_read:
        stream.close()

    caplog.set_level(logging.INFO, logger=LOGGER)
    windows = _count_windows(monkeypatch)
    kept = _streams(episodes, 2, modules_to_update=modules)
    first = _lockstep(kept, per_epoch)
    assert [s.state()["epoch"] for s in kept] == [0, 0]
    _break_files(tmp_path)
    later = _lockstep(kept, 2 * per_epoch)
    states = [s.state() for s in kept]
    for stream in kept:
        stream.close()

    assert _same(first + later, expected)
    assert len(windows) == 1  # epoch 0's only window
    assert [(s["epoch"], s["batches_consumed"]) for s in states] == [(2, per_epoch)] * 2
    [message] = _messages(caplog)
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))}: \d+\.\d KiB of selected columns kept in memory \(cache "
        r"budget \d+\.\d (MiB|GiB)\); later epochs read no file",
        message,
    ), message


@pytest.mark.timeout(180)
def test_a_resume_reads_its_epoch_then_serves_the_next_from_memory(tmp_path, ray_session):
    episodes = read_episodes(_write_rows(tmp_path))
    [whole] = _streams(episodes)
    with whole:
        expected = [b["m0"]["rewards"].numpy() for b in whole.take(3 * PER_EPOCH)]

    [before] = _streams(episodes)
    with before:
        list(before.take(PER_EPOCH + 5))
        saved = before.state()
    [resumed] = _streams(episodes)
    resumed.restore(saved)
    with resumed:
        got = [b["m0"]["rewards"].numpy() for b in resumed.take(2 * PER_EPOCH - 5)]

    assert (saved["epoch"], saved["batches_consumed"]) == (1, 5)
    assert _same(got, expected[PER_EPOCH + 5 :])


@pytest.mark.timeout(180)
def test_over_the_budget_every_epoch_reads_the_files_and_a_log_line_says_so(
    tmp_path, ray_session, caplog, monkeypatch
):
    episodes = read_episodes(_write_rows(tmp_path))
    [re_read] = _streams(episodes, cache_budget_mb=0)
    with re_read:
        expected = [b["m1"]["rewards"].numpy() for b in re_read.take(3 * PER_EPOCH)]
    assert _messages(caplog) == []  # a budget of 0 turns the cache off without a word

    caplog.set_level(logging.INFO, logger=LOGGER)
    windows = _count_windows(monkeypatch)
    [over] = _streams(episodes, cache_budget_mb=0.01)
    with over:
        got = [b["m1"]["rewards"].numpy() for b in over.take(3 * PER_EPOCH)]

    assert _same(got, expected)
    assert len(windows) >= 3  # one window an epoch, the next one maybe read ahead
    [message] = _messages(caplog)
    assert re.fullmatch(
        rf"{re.escape(str(tmp_path))}: not kept in memory for later epochs: its selected "
        r"columns take about \d+\.\d KiB, over the cache budget of 10\.2 KiB; every epoch "
        r"reads the files again \(raise cache_budget_mb to keep them\)",
        message,
    ), message


def test_a_bad_cache_budget_is_refused(tmp_path, ray_session):
    episodes = read_episodes(_write_rows(tmp_path))
    with pytest.raises(ValueError) as refused:
        _streams(episodes, cache_budget_mb=-1)
    assert str(refused.value) == (
        "cache_budget_mb must be >= 0 MiB (0 reads every epoch from the files) or None "
        "(a quarter of Ray's object store), got -1"
    )
    # Task samples are held in memory: a cache budget is an option of row streams only.
    samples = task_samples(episodes, support=10, query=10)
    with pytest.raises(TypeError) as refused:
        RowStream(samples, cache_budget_mb=0)
    assert str(refused.value) == (
        "RowStream streams the rows of Episodes (read_episodes) or of a Ray DataIterator "
        "(one learner's shard), got TaskSamples; pass task samples to split_for_learners "
        "as they are (or in a TaskStream)"
    )


def _tables(*ranges: tuple[int, int]) -> list[pa.Table]:
    return [pa.table({"row": np.arange(lo, hi)}) for lo, hi in ranges]


def _rows(tables) -> list[int]:
    return [row for table in tables for row in table.column("row").to_pylist()]


def test_file_tables_cut_blocks_at_file_boundaries_and_serve_any_order():
    # Files 0, 1, 2 hold 3, 0 and 5 rows; read in the order 2, 0, 1 as blocks that
    # straddle files: rows 0-4 are file 2's, rows 5-7 file 0's.
    kept = FileTables([3, 0, 5], 1 << 20, describe="data")
    passed = list(kept.record([2, 0, 1], _tables((0, 2), (2, 6), (6, 8))))

    assert _rows(passed) == list(range(8)) and kept.complete
    assert _rows(kept.tables([0, 1, 2])) == [5, 6, 7, 0, 1, 2, 3, 4]
    assert _rows(kept.tables([2, 0, 1])) == list(range(8))


def test_file_tables_keep_nothing_from_an_epoch_left_early_or_longer_than_its_files():
    kept = FileTables([3, 5], 1 << 20, describe="data")
    epoch = kept.record([0, 1], _tables((0, 4), (4, 8)))
    next(epoch)
    epoch.close()
    assert not kept.complete and not kept.refused

    list(kept.record([0, 1], _tables((0, 4), (4, 9))))  # one row more than the footers say
    assert not kept.complete
    with pytest.raises(RuntimeError, match="no epoch has been recorded to its end"):
        list(kept.tables([0, 1]))

    list(kept.record([1, 0], _tables((0, 8))))
    assert kept.complete and _rows(kept.tables([0, 1])) == [5, 6, 7, 0, 1, 2, 3, 4]


def test_file_tables_over_the_budget_say_so_once_and_never_keep(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    one_row_bytes = _tables((0, 1))[0].nbytes
    kept = FileTables([4, 4], 5 * one_row_bytes, describe="data")
    for _ in range(2):
        assert _rows(kept.record([0, 1], _tables((0, 8)))) == list(range(8))

    assert kept.refused and not kept.complete
    assert _messages(caplog) == [
        "data: not kept in memory for later epochs: its selected columns take about 64 "
        "bytes, over the cache budget of 40 bytes; every epoch reads the files again "
        "(raise cache_budget_mb to keep them)"
    ]
