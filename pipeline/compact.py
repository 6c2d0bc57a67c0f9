"""Rewrite a dataset into well-sized files sorted by (task_id, eps_id, t): ``offmeta data
compact``.

Many small files cost a file open and a footer each, whatever their size; a stream reads
~128 MiB files with row groups of 64K rows at the speed of one file. ``compact``
validates the source (every check ``read_episodes`` runs), reads it file by file, sorts
it with bounded memory (``pipeline.external_sort``), writes ``part-NNNNN.parquet`` files
with canonical names and types, and carries ``dataset.json`` over with the source's
fingerprint in ``compacted_from``. Everything is written in a hidden directory beside
``out``, validated there, and renamed to ``out`` at the end: a refused or failed run
leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import statistics
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.dataset import DatasetInfo, canonical_table, inspect_episodes
from pipeline.external_sort import sort_tables
from pipeline.metadata import CompactedFrom, DatasetMetadata, write_metadata
from pipeline.parquet_files import read_files
from pipeline.schema import DatasetError
from pipeline.sources import Source

FILE_BYTES = 128 << 20
"""Target size of an output file on disk (a file ends after the row group that reaches it)."""
ROW_GROUP_ROWS = 65_536
MEMORY_BYTES = 512 << 20
"""Rows held in memory at once while sorting (see ``pipeline.external_sort``)."""
SORT_KEYS = ("task_id", "eps_id", "t")

SMALL_FILE_BYTES = 1 << 20
MANY_FILES = 100
"""``validate`` suggests ``compact`` for more than ``MANY_FILES`` files whose median size is
below ``SMALL_FILE_BYTES``: each file costs ~0.5 ms to open whatever its size, as much as
reading ~175 KB here, so below 1 MiB the opens take a sizeable share of a read."""

_ROW_GROUP_BYTES = 128 << 20
"""A row group also ends at this many bytes in memory (wide rows: images)."""


def compact(
    source: Source,
    out: str | os.PathLike[str],
    *,
    column_map: Mapping[str, str] | None = None,
    filesystem: pafs.FileSystem | None = None,
    file_bytes: int = FILE_BYTES,
    row_group_rows: int = ROW_GROUP_ROWS,
    memory_bytes: int = MEMORY_BYTES,
) -> DatasetInfo:
    """Rewrite ``source`` into the new local directory ``out`` and describe the result.

    Raises ``DatasetError`` for a source that does not validate (nothing is written) and
    ``FileExistsError`` when ``out`` exists; ``out`` is never partly written.
    """
    target = Path(out).absolute()
    if target.exists():
        raise FileExistsError(
            f"{target}: already exists; expected a new directory (compact never overwrites: "
            "choose another --out, or remove it first)"
        )
    if not target.parent.is_dir():
        raise FileNotFoundError(
            f"{target.parent}: no such directory; expected the directory that will hold {out}"
        )
    info = inspect_episodes(source, column_map=column_map, filesystem=filesystem)
    _refuse_output_inside_source(info, target)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.compact-", dir=target.parent))
    try:
        data, scratch = work / "data", work / "runs"
        data.mkdir()
        scratch.mkdir()
        keys = [key for key in SORT_KEYS if key != "task_id" or info.schema.has_task_id]
        ordered = sort_tables(
            _canonical_tables(info), keys, run_bytes=memory_bytes, scratch=scratch
        )
        names = _write_parts(ordered, data, file_bytes, row_group_rows)
        shutil.rmtree(scratch)
        write_metadata(data, _metadata(info, names))
        written = inspect_episodes(data)
        if (written.num_rows, written.num_episodes) != (info.num_rows, info.num_episodes):
            raise RuntimeError(
                f"compact wrote {written.num_rows} rows in {written.num_episodes} episodes "
                f"from {info.num_rows} rows in {info.num_episodes}; expected all of them "
                f"(a bug in compact: nothing was written to {target})"
            )
        data.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    moved = tuple(str(target / Path(path).name) for path in written.files)
    return dataclasses.replace(written, root=str(target), files=moved)


def small_files_warning(info: DatasetInfo) -> str | None:
    """Advice to compact a dataset of many tiny files; ``None`` for any other dataset."""
    if len(info.files) <= MANY_FILES:
        return None
    median = statistics.median(info.file_sizes)
    if median >= SMALL_FILE_BYTES:
        return None
    return (
        f"{info.root}: {len(info.files)} files with a median size of {median / 1024:.1f} KiB; "
        f"reading costs a file open per file whatever its size, so files under "
        f"{SMALL_FILE_BYTES >> 20} MiB read slowly. Rewrite them into ~{FILE_BYTES >> 20} MiB "
        f"sorted files with: offmeta data compact {info.root} --out NEW_DIRECTORY"
    )


def _refuse_output_inside_source(info: DatasetInfo, target: Path) -> None:
    if not isinstance(info.filesystem, pafs.LocalFileSystem):
        return
    root = Path(info.root).resolve()
    if target.resolve().is_relative_to(root):
        raise DatasetError(
            f"{target}: inside the source dataset {root}; expected an output directory "
            "outside it (its files would be read as part of the source from then on)"
        )


def _canonical_tables(info: DatasetInfo) -> Iterator[pa.Table]:
    """The source's tables, file by file, in canonical names and types."""
    for part in read_files(info.files, info.file_sizes, info.filesystem):
        yield canonical_table(info, part.table)


def _write_parts(
    tables: Iterable[pa.Table], directory: Path, file_bytes: int, row_group_rows: int
) -> list[str]:
    """Write ``tables`` in order as row groups of ``row_group_rows`` rows (or
    ``_ROW_GROUP_BYTES``) into ``part-NNNNN.parquet`` files of about ``file_bytes``."""
    names: list[str] = []
    writer: pq.ParquetWriter | None = None
    sink: pa.NativeFile | None = None

    def write(group: pa.Table) -> None:
        nonlocal writer, sink
        if writer is None or sink is None:
            names.append(f"part-{len(names):05d}.parquet")
            sink = pa.OSFile(str(directory / names[-1]), "wb")
            writer = pq.ParquetWriter(sink, group.schema, compression="zstd")
        writer.write_table(group, row_group_size=group.num_rows)
        if sink.tell() >= file_bytes:
            writer.close()
            sink.close()
            writer = sink = None

    rows = 0
    held: list[pa.Table] = []
    held_rows = 0
    try:
        for table in tables:
            rows = rows or _group_rows(table, row_group_rows)
            held.append(table)
            held_rows += table.num_rows
            if held_rows < rows:
                continue
            joined = pa.concat_tables(held)
            start = 0
            while joined.num_rows - start >= rows:
                write(joined.slice(start, rows))
                start += rows
            held, held_rows = [joined.slice(start)], joined.num_rows - start
        if held_rows:
            write(pa.concat_tables(held))
    finally:
        if writer is not None and sink is not None:
            writer.close()
            sink.close()
    return names


def _group_rows(table: pa.Table, row_group_rows: int) -> int:
    """``row_group_rows``, or fewer when rows are so wide that a row group would pass
    ``_ROW_GROUP_BYTES`` in memory (judged from the first table)."""
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    return max(1, min(row_group_rows, _ROW_GROUP_BYTES // per_row))


def _metadata(info: DatasetInfo, names: list[str]) -> DatasetMetadata:
    if info.metadata:
        metadata = DatasetMetadata.model_validate(info.metadata)
    else:
        metadata = DatasetMetadata(id=Path(info.root).name or "dataset")
    return metadata.model_copy(
        update={
            "num_rows": info.num_rows,
            "files": names,
            "compacted_from": CompactedFrom(fingerprint=info.fingerprint, files=len(info.files)),
        }
    )
