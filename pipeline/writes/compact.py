"""Rewrite a dataset into well-sized files sorted by (task_id, eps_id, t): ``offmeta data
compact``.

Many small files cost a file open and a footer each, whatever their size; a stream reads
~128 MiB files with row groups of 64K rows at the speed of one file. ``compact``
validates the source (every check ``read_episodes`` runs), reads it file by file in
canonical names and types, sorts it with bounded memory (``pipeline.writes.external_sort``), and
writes it as the importers do (``pipeline.writes.writer``: ``part-NNNNN.parquet`` files,
staged in a hidden directory beside ``out``, validated, renamed to ``out`` at the end, so a
refused or failed run leaves nothing behind), with ``dataset.json`` carried over and the
source's fingerprint in ``compacted_from``.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from pipeline.contract.dataset_json import CompactedFrom, DatasetMetadata
from pipeline.contract.schema import DatasetError
from pipeline.io.dataset_source import Source, uri_of
from pipeline.io.parquet_files import read_files
from pipeline.reads.episodes import DatasetInfo, canonical_table, inspect_episodes
from pipeline.writes.external_sort import sort_tables
from pipeline.writes.writer import FILE_BYTES, ROW_GROUP_ROWS, DatasetWriter

MEMORY_BYTES = 512 << 20
"""Rows held in memory at once while sorting (see ``pipeline.writes.external_sort``)."""
SORT_KEYS = ("task_id", "eps_id", "t")

SMALL_FILE_BYTES = 1 << 20
MANY_FILES = 100
"""``validate`` suggests ``compact`` for more than ``MANY_FILES`` files whose median size is
below ``SMALL_FILE_BYTES``: each file costs ~0.5 ms to open whatever its size, as much as
reading ~175 KB here, so below 1 MiB the opens take a sizeable share of a read."""


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
    keys = [key for key in SORT_KEYS if key != "task_id" or info.schema.has_task_id]
    with DatasetWriter(
        target, purpose="compact", row_group_rows=row_group_rows, file_bytes=file_bytes
    ) as writer:
        tables = _canonical_tables(info)
        for table in sort_tables(tables, keys, run_bytes=memory_bytes, scratch=writer.scratch):
            writer.write(table)
        written = writer.finish(_metadata(info))
        if (written.num_rows, written.num_episodes) != (info.num_rows, info.num_episodes):
            raise RuntimeError(
                f"compact wrote {written.num_rows} rows in {written.num_episodes} episodes "
                f"from {info.num_rows} rows in {info.num_episodes}; expected all of them "
                f"(a bug in compact: nothing was written to {target})"
            )
        return writer.publish()


def small_files_warning(info: DatasetInfo) -> str | None:
    """Advice to compact a dataset of many tiny files; ``None`` for any other dataset."""
    if len(info.files) <= MANY_FILES:
        return None
    median = statistics.median(info.file_sizes)
    if median >= SMALL_FILE_BYTES:
        return None
    root = uri_of(info.filesystem, info.root)
    return (
        f"{root}: {len(info.files)} files with a median size of {median / 1024:.1f} KiB; "
        f"reading costs a file open per file whatever its size, so files under "
        f"{SMALL_FILE_BYTES >> 20} MiB read slowly. Rewrite them into ~{FILE_BYTES >> 20} MiB "
        f"sorted files with: offmeta data compact {root} --out NEW_DIRECTORY"
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


def _metadata(info: DatasetInfo) -> DatasetMetadata:
    if info.metadata:
        metadata = DatasetMetadata.model_validate(info.metadata)
    else:
        metadata = DatasetMetadata(id=Path(info.root).name or "dataset")
    return metadata.model_copy(
        update={
            "compacted_from": CompactedFrom(fingerprint=info.fingerprint, files=len(info.files))
        }
    )
