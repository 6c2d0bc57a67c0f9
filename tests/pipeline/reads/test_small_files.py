"""Reads group files into read tasks: grouping by size and count, the same rows as a read
per file in any file order, a bounded number of threads, and thousands of one-row files
read to the end (read_episodes and a stream epoch)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipeline.contract.schema import DatasetError
from pipeline.io.parquet_files import READ_THREADS, group_files, map_files, read_files
from pipeline.reads.episodes import read_episodes
from pipeline.reads.file_groups import MAX_FILES_PER_TASK, GroupedParquetDatasource, read_grouped
from pipeline.streams.learner_stream import split_for_learners
from tests.helpers.episode_files import episode_table, write

TINY_FILES = 2000
MAX_THREADS = 64


def _threads() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise AssertionError("/proc/self/status has no Threads line")


def _one_row_files(directory: Path, count: int) -> list[str]:
    """``count`` one-row files; the row of file ``i`` has ``rewards == i`` (episodes of 10)."""
    table = episode_table(count, action_dim=None, episode_length=10, tasks=("a", "b", "c"))
    table = table.set_column(
        table.schema.get_field_index("rewards"),
        "rewards",
        pa.array(np.arange(count, dtype=np.float32)),
    )
    paths = []
    for index in range(count):
        paths.append(str(write(directory / f"part-{index:05d}.parquet", table.slice(index, 1))))
    return paths


def _sizes(paths: list[str]) -> list[int]:
    return [Path(path).stat().st_size for path in paths]


def _plain(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded: tables equal in values whatever their dictionaries."""
    columns = [
        c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c for c in table.columns
    ]
    return pa.table(columns, names=table.column_names)


def _ordered(dataset):
    """Ray hands out the blocks of several tasks as they finish unless told otherwise."""
    dataset.context.execution_options.preserve_order = True
    return dataset


def _rewards(dataset) -> list[float]:
    batches = dataset.iter_batches(batch_size=None, batch_format="pyarrow")
    return [value for batch in batches for value in batch.column("rewards").to_pylist()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> list[str]:
    return _one_row_files(tmp_path_factory.mktemp("tiny"), TINY_FILES)


def test_group_files_respects_the_target_size_and_count_in_order():
    sizes = [40, 40, 30, 100, 10, 500, 1, 1, 1]
    groups = group_files(sizes, 100)
    assert [list(g) for g in groups] == [[0, 1], [2], [3], [4], [5], [6, 7, 8]]
    assert [list(g) for g in group_files(sizes, 100, max_files=2)] == [
        [0, 1], [2], [3], [4], [5], [6, 7], [8],
    ]  # fmt: skip
    assert [list(g) for g in group_files([1] * 5, 100)] == [[0, 1, 2, 3, 4]]
    assert group_files([], 100) == []


def test_read_tasks_hold_groups_of_files_with_their_rows(tiny):
    sizes = _sizes(tiny)
    rows = [1] * len(tiny)
    many = GroupedParquetDatasource(tiny, sizes, rows, pafs.LocalFileSystem())
    tasks = many.get_read_tasks(parallelism=200)
    split = MAX_FILES_PER_TASK
    assert [t.metadata.num_rows for t in tasks] == [split, TINY_FILES - split]
    assert [list(t.metadata.input_files) for t in tasks] == [tiny[:split], tiny[split:]]

    target = 10 * max(sizes)
    by_size = GroupedParquetDatasource(
        tiny, sizes, rows, pafs.LocalFileSystem(), target_bytes=target
    )
    for task in by_size.get_read_tasks(parallelism=1):
        files = task.metadata.input_files
        assert sum(Path(f).stat().st_size for f in files) <= target
        assert task.metadata.num_rows == len(files)


def test_grouped_read_gives_the_rows_of_a_read_per_file_in_file_order(tiny, ray_session):
    files = tiny[:60]
    sizes, rows = _sizes(files), [1] * len(files)
    per_file = pa.concat_tables([pq.read_table(f) for f in files])
    fs = pafs.LocalFileSystem()
    for target, max_files in [(1, 1), (10 * max(sizes), 1024), (1 << 30, 7)]:
        dataset = _ordered(
            read_grouped(files, sizes, rows, fs, target_bytes=target, max_files=max_files)
        )
        table = pa.concat_tables(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
        assert _plain(table).equals(_plain(per_file)), (target, max_files)
        assert dataset.count() == len(files)

    order = np.random.default_rng(3).permutation(len(files))
    shuffled = _ordered(
        read_grouped([files[i] for i in order], [sizes[i] for i in order], rows, fs, max_files=8)
    )
    assert _rewards(shuffled) == order.astype(float).tolist()
    assert _rewards(shuffled.select_columns(["rewards"])) == order.astype(float).tolist()


def test_read_files_bounds_threads_and_names_a_broken_file(tmp_path):
    paths = _one_row_files(tmp_path, 200)
    before = _threads()
    peak = before
    seen = []
    for part in read_files(paths, _sizes(paths), pafs.LocalFileSystem()):
        peak = max(peak, _threads())
        seen.append(part.path)
    assert seen == paths
    # Its own pool, plus Arrow's process-wide I/O and CPU pools (fixed sizes).
    assert peak - before <= READ_THREADS + pa.io_thread_count() + pa.cpu_count()
    assert not [t for t in threading.enumerate() if t.name.startswith("offmeta-read")]

    Path(paths[5]).write_bytes(b"not parquet any more")
    with pytest.raises(DatasetError) as refused:
        list(read_files(paths, _sizes(paths), pafs.LocalFileSystem()))
    message = str(refused.value)
    assert message.startswith(f"{paths[5]}: cannot be read (")
    assert message.endswith(
        "); expected readable Parquet data (validation reads footers and id columns "
        "only: was the file changed since, or is it corrupted?)"
    )


def test_map_files_raises_the_first_failure_in_path_order():
    def check(path: str) -> str:
        if path == "b":
            time.sleep(0.2)  # fails last in time, first in order
            raise ValueError("b is broken")
        if path == "d":
            raise ValueError("d is broken")
        return path.upper()

    assert map_files(check, ["a", "c"]) == ["A", "C"]
    with pytest.raises(ValueError, match=r"^b is broken$"):
        map_files(check, ["a", "b", "c", "d", "e"])


@pytest.mark.timeout(300)
def test_thousands_of_one_row_files_read_and_stream_to_the_end(tiny, ray_session):
    directory = Path(tiny[0]).parent
    episodes = read_episodes(directory)
    assert episodes.num_rows == TINY_FILES
    assert episodes.dataset.count() == TINY_FILES
    assert sorted(_rewards(episodes.dataset)) == list(range(TINY_FILES))

    def worker_threads(batch: pa.Table) -> pa.Table:
        # Self-contained: Ray workers cannot import this test module.
        with open("/proc/self/status") as status:
            threads = next(int(line.split()[1]) for line in status if line.startswith("Threads"))
        return pa.table({"threads": [threads]})

    # Measured inside the read tasks' own processes (the map runs fused with the read).
    threads = episodes.dataset.map_batches(worker_threads, batch_format="pyarrow", batch_size=None)
    assert max(row["threads"] for row in threads.take_all()) <= MAX_THREADS

    [stream] = split_for_learners(episodes, 1, minibatch_size=100, seed=0)
    with stream:
        taken = [batch["default_policy"]["rewards"] for batch in stream.take(TINY_FILES // 100)]
    assert sorted(np.concatenate([t.numpy() for t in taken]).tolist()) == list(range(TINY_FILES))
