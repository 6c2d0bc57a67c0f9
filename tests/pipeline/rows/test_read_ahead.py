"""Read-ahead over Ray executions: order, the two-window bound, errors, early close,
reading across the epoch boundary; and the zero-copy re-cutting of blocks into
super-batches."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest

from pipeline.rows.feed import cut_tables
from pipeline.rows.read_ahead import EpochReads, read_ahead


def _values(tables) -> list[int]:
    return [v for table in tables for v in table.column("x").to_pylist()]


def _dataset(start: int, stop: int, blocks: int = 3):
    import ray.data

    pieces = np.array_split(np.arange(start, stop), blocks)
    return ray.data.from_arrow([pa.table({"x": piece}) for piece in pieces])


def test_cut_tables_gives_exact_sizes_across_inputs_without_copying():
    inputs = [pa.table({"x": np.arange(a, b)}) for a, b in [(0, 5), (5, 6), (6, 17)]]
    cut = list(cut_tables(inputs, 4))
    assert [t.num_rows for t in cut] == [4, 4, 4, 4, 1]
    assert _values(cut) == list(range(17))
    # The second super-batch spans all three inputs: their chunks, not a copy.
    assert cut[1].column("x").num_chunks == 3
    assert cut[0].column("x").chunk(0).buffers()[1].address == (
        inputs[0].column("x").chunk(0).buffers()[1].address
    )


def test_cut_tables_of_nothing_gives_nothing():
    assert list(cut_tables([], 4)) == []
    assert list(cut_tables([pa.table({"x": pa.array([], pa.int64())})], 4)) == []


def test_read_ahead_gives_every_window_in_order(ray_session):
    windows = [lambda a=a: _dataset(a, a + 10) for a in range(0, 50, 10)]
    assert _values(read_ahead(windows)) == list(range(50))


def test_read_ahead_honours_row_ranges_of_a_limit(ray_session):
    assert _values(read_ahead([lambda: _dataset(0, 100, blocks=4).limit(37)])) == list(range(37))


def test_read_ahead_turns_pandas_blocks_into_arrow(ray_session):
    import pandas as pd
    import ray.data

    blocks = list(read_ahead([lambda: ray.data.from_pandas(pd.DataFrame({"x": range(5)}))]))
    assert all(isinstance(block, pa.Table) for block in blocks)
    assert _values(blocks) == list(range(5))


def test_read_ahead_holds_at_most_two_windows(ray_session):
    """Window k is built only after the consumer has taken every block of window k - 2
    (each window here has 3 blocks)."""
    taken = 0
    taken_at_build: dict[int, int] = {}

    def build(index: int):
        taken_at_build[index] = taken
        return _dataset(100 * index, 100 * index + 100, blocks=3)

    for _ in read_ahead([lambda i=i: build(i) for i in range(6)]):
        time.sleep(0.05)  # a slow consumer: an ungated helper would run far ahead
        taken += 1
    assert taken == 18
    assert sorted(taken_at_build) == list(range(6))
    for index, blocks in taken_at_build.items():
        assert blocks >= 3 * (index - 1), (index, blocks)


def test_read_ahead_relays_a_failed_execution(ray_session):
    def broken(batch: pa.Table) -> pa.Table:
        raise ValueError("bad block")

    windows = [lambda: _dataset(0, 10), lambda: _dataset(10, 20).map_batches(broken)]
    with pytest.raises(Exception, match="bad block"):
        list(read_ahead(windows))


def test_read_ahead_relays_a_failure_to_build_a_window(ray_session):
    def missing():
        raise FileNotFoundError("part-7.parquet")

    with pytest.raises(FileNotFoundError, match="part-7"):
        list(read_ahead([lambda: _dataset(0, 10), missing]))


def test_closing_early_stops_the_helper_threads(ray_session):
    blocks = read_ahead(
        [lambda a=a: _dataset(a, a + 10) for a in range(0, 100, 10)], name="read-ahead-test"
    )
    next(blocks)
    blocks.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("read-ahead-test")]


def test_a_failure_to_list_the_windows_is_relayed(ray_session):
    def windows():
        yield lambda: _dataset(0, 10)
        raise OSError("listing failed")

    with pytest.raises(OSError, match="listing failed"):
        list(read_ahead(windows()))


class _Epochs:
    """Three windows of three blocks per epoch; epoch ``e`` holds rows ``[1000 e, 1000 e +
    300)``. Records, for every window built, how many blocks the consumer had taken."""

    def __init__(self) -> None:
        self.taken = 0
        self.built: list[tuple[int, int, int]] = []  # (epoch, window, blocks taken)

    def windows(self, epoch: int) -> list:
        return [lambda w=w: self._build(epoch, w) for w in range(3)]

    def _build(self, epoch: int, window: int):
        self.built.append((epoch, window, self.taken))
        start = 1000 * epoch + 100 * window
        return _dataset(start, start + 100, blocks=3)

    def consume(self, tables) -> list[int]:
        values = []
        for table in tables:
            time.sleep(0.02)  # a slow consumer: reads run ahead as far as they may
            self.taken += 1
            values += table.column("x").to_pylist()
        return values


def _read_ahead_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("epoch-reads-test")]


@pytest.mark.timeout(120)
def test_epoch_reads_start_the_next_epoch_while_the_last_window_is_taken(ray_session):
    epochs = _Epochs()
    reads = EpochReads(epochs.windows, name="epoch-reads-test")
    try:
        assert epochs.consume(reads.tables(0)) == list(range(300))
        # Epoch 1's first window was built once epoch 0's second window was taken (six
        # blocks), before the consumer reached the end of epoch 0 (nine blocks)...
        assert (1, 0, 6) in epochs.built
        # ...and no further: at most two windows are held across the boundary.
        assert [b for b in epochs.built if b[0] == 1] == [(1, 0, 6)]
        assert epochs.consume(reads.tables(1)) == list(range(1000, 1300))
        # The read went on from epoch 0 into epoch 1: every window was built once.
        assert sorted(b[:2] for b in epochs.built if b[0] <= 1) == [
            (e, w) for e in (0, 1) for w in range(3)
        ]
    finally:
        reads.close()
    assert _read_ahead_threads() == []


@pytest.mark.timeout(120)
def test_epoch_reads_restart_at_an_epoch_that_does_not_follow(ray_session):
    epochs = _Epochs()
    reads = EpochReads(epochs.windows, name="epoch-reads-test")
    try:
        first = reads.tables(0)
        next(first)
        first.close()  # left mid-epoch: the read stops
        assert _read_ahead_threads() == []
        assert epochs.consume(reads.tables(0)) == list(range(300))
        # A resume at epoch 5 after epoch 0: a new read, from epoch 5's first window.
        assert epochs.consume(reads.tables(5)) == list(range(5000, 5300))
        assert [b[:2] for b in epochs.built if b[0] == 5][:1] == [(5, 0)]
    finally:
        reads.close()
        reads.close()
    assert _read_ahead_threads() == []


def test_epoch_reads_refuse_an_epoch_without_windows(ray_session):
    reads = EpochReads(lambda epoch: [], name="epoch-reads-test")
    with pytest.raises(ValueError, match="epoch 3 has no window to read: expected at least one"):
        list(reads.tables(3))
    reads.close()
    assert _read_ahead_threads() == []
