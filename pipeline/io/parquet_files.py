"""Known Parquet files, read in order with a bounded number of threads, and cut into
groups by size on disk. No Ray: ``pipeline.reads.file_groups`` makes each group a Ray read
task, and ``pipeline.writes.compact`` reads a whole dataset through ``read_files``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.contract.schema import DatasetError

READ_THREADS = 4
"""Threads that open and read small files ahead of their consumer: a file open is latency
(milliseconds on object storage) that pyarrow waits out without holding the GIL."""

_T = TypeVar("_T")

_WHOLE_FILE_BYTES = 4 << 20
"""Files up to this size on disk are read whole by the pool, ahead of the consumer;
larger ones row group by row group on the consumer's thread (their opens are a small part
of their reads)."""
_FEW_CHUNKS = 16
_AHEAD_BYTES = 8 << 20
"""At most this many bytes on disk are read ahead (and at most ``2 * threads`` files), so a
read holds a few times this in memory whatever the files' sizes."""


class FilePart(NamedTuple):
    """A table read from one file: the whole file, or one of its row groups."""

    path: str
    table: pa.Table


def group_files(
    sizes: Sequence[int], target_bytes: int, max_files: int | None = None
) -> list[range]:
    """Positions of consecutive files cut into runs of at most ``target_bytes`` on disk and
    at most ``max_files`` files; a file larger than ``target_bytes`` is a run of its own."""
    groups: list[range] = []
    start, total = 0, 0
    for index, size in enumerate(sizes):
        too_many = max_files is not None and index - start >= max_files
        if index > start and (total + size > target_bytes or too_many):
            groups.append(range(start, index))
            start, total = index, 0
        total += size
    if start < len(sizes):
        groups.append(range(start, len(sizes)))
    return groups


def file_sizes(files: Sequence[str], filesystem: pafs.FileSystem) -> list[int]:
    """Each file's size on disk, refusing a file that went away since validation."""
    infos = filesystem.get_file_info(list(files))
    gone = [info.path for info in infos if info.type != pafs.FileType.File]
    if gone:
        raise DatasetError(
            f"{', '.join(gone)}: no longer a file; expected the files that "
            "read_episodes validated (read the dataset again after changing it)"
        )
    return [info.size for info in infos]


def map_files(
    function: Callable[[str], _T], paths: Sequence[str], *, threads: int = READ_THREADS
) -> list[_T]:
    """``function(path)`` for every path, by a pool of ``threads``, in the order of
    ``paths``. The first failure in that order is raised, after cancelling the calls not
    yet started; ``function`` should return something small (it is held for every path)."""
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="offmeta-files")
    try:
        return list(pool.map(function, paths))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_files(
    files: Sequence[str],
    sizes: Sequence[int],
    filesystem: pafs.FileSystem,
    columns: Sequence[str] | None = None,
    *,
    threads: int = READ_THREADS,
) -> Iterator[FilePart]:
    """The tables of ``files`` in order: a small file as one table, read by a pool of
    ``threads`` up to ``2 * threads`` files (and ``_AHEAD_BYTES`` on disk) ahead; a large
    file one row group at a time.

    Raises ``DatasetError`` naming a file that cannot be read. Closing the generator
    cancels the reads not yet started and waits for the running ones.
    """
    read_columns = list(columns) if columns is not None else None
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="offmeta-read")
    ahead: deque[tuple[int, Future[FilePart]]] = deque()
    ahead_bytes = 0
    try:
        for path, size in zip(files, sizes, strict=True):
            if size > _WHOLE_FILE_BYTES:
                while ahead:
                    yield ahead.popleft()[1].result()
                ahead_bytes = 0
                yield from _row_groups(path, filesystem, read_columns)
                continue
            ahead.append((size, pool.submit(_whole_file, path, filesystem, read_columns)))
            ahead_bytes += size
            while len(ahead) >= 2 * threads or (len(ahead) > 1 and ahead_bytes > _AHEAD_BYTES):
                done, part = ahead.popleft()
                ahead_bytes -= done
                yield part.result()
        while ahead:
            yield ahead.popleft()[1].result()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def read_blocks(
    files: Sequence[str],
    sizes: Sequence[int],
    filesystem: pafs.FileSystem,
    columns: Sequence[str] | None,
    block_bytes: int,
) -> Iterator[pa.Table]:
    """The tables of ``files`` (one read task's group, see ``pipeline.reads.file_groups`` and
    ``pipeline.rows.file_windows``) joined into blocks of at most ``block_bytes`` (a larger
    table is a block of its own). Blocks never grow past that size: the driver maps every
    block a stream reads, so its memory follows their size."""
    held: list[pa.Table] = []
    held_bytes = 0
    for part in read_files(files, sizes, filesystem, columns):
        if held and held_bytes + part.table.nbytes > block_bytes:
            yield _joined(held)
            held, held_bytes = [], 0
        held.append(part.table)
        held_bytes += part.table.nbytes
    if held:
        yield _joined(held)


def _joined(tables: list[pa.Table]) -> pa.Table:
    """The tables as one; copied into one chunk per column when they are many (small
    files): a thousand one-row chunks would make every later slice and take walk a
    thousand pieces, while a few row groups' chunks cost nothing to keep."""
    joined = pa.concat_tables(tables)
    return joined.combine_chunks() if len(tables) > _FEW_CHUNKS else joined


def _whole_file(path: str, filesystem: pafs.FileSystem, columns: list[str] | None) -> FilePart:
    try:
        with filesystem.open_input_file(path) as handle:
            return FilePart(path, pq.ParquetFile(handle).read(columns=columns, use_threads=False))
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, exc) from None


def _row_groups(
    path: str, filesystem: pafs.FileSystem, columns: list[str] | None
) -> Iterator[FilePart]:
    try:
        with filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for index in range(parquet.num_row_groups):
                yield FilePart(
                    path, parquet.read_row_group(index, columns=columns, use_threads=False)
                )
    except (pa.ArrowInvalid, OSError) as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: str, exc: Exception) -> DatasetError:
    reason = " ".join(str(exc).split())
    return DatasetError(
        f"{path}: cannot be read ({reason}); expected readable Parquet data (validation "
        "reads footers and id columns only: was the file changed since, or is it corrupted?)"
    )


def leaf_index(footer: pq.ParquetFile, name: str) -> int:
    """Index of the Parquet leaf column of a primitive top-level column ``name`` (whose
    row-group statistics say its min and max)."""
    schema = footer.metadata.schema
    return next(i for i in range(len(schema)) if schema.column(i).path == name)
