"""Write an importer's sorted canonical rows as a dataset: well-sized Parquet files, one
``dataset.json``, published all at once.

Rows arrive already sorted by (task, episode, t) in tables of any size; they leave in row
groups of ``ROW_GROUP_ROWS`` rows and files of about ``FILE_BYTES`` bytes. Everything is
written into a hidden staging directory next to the output, checked with
``inspect_episodes`` (the checks ``offmeta data validate`` runs), and renamed into place only
then: a refused or failed import leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.dataset import inspect_episodes
from pipeline.metadata import DatasetMetadata, write_metadata

ROW_GROUP_ROWS = 65_536
FILE_BYTES = 128 << 20
CANONICAL_ORDER = (
    "eps_id",
    "t",
    "obs",
    "actions",
    "rewards",
    "terminateds",
    "truncateds",
    "new_obs",
    "task_id",
    "module_id",
)
_ID_COLUMNS = ("task_id", "module_id")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class SourceFacts:
    """What only the importer knows about the source it read."""

    source_rows: int
    """Rows read from the source, before dropping duplicates or padding rows."""
    duplicate_rows: int
    """Exact repeats of a recorded step, kept once (RLlib's recorder rewrites steps)."""
    padding_rows: int
    """Rows that are not transitions (Minari's last row of each episode)."""
    source_fingerprint: str


@dataclass(frozen=True)
class ImportSummary:
    """What an import read and wrote."""

    out: str
    """The dataset directory written."""
    rows: int
    episodes: int
    files: int
    tasks: tuple[str, ...]
    modules: tuple[str, ...]
    fingerprint: str
    """The written dataset's fingerprint (as ``read_episodes`` computes it)."""
    source_rows: int
    """Rows read from the source, before dropping duplicates or padding rows."""
    duplicate_rows: int
    """Exact repeats of a recorded step, kept once (RLlib's recorder rewrites steps)."""
    padding_rows: int
    """Rows that are not transitions (Minari's last row of each episode)."""
    source_fingerprint: str

    def line(self) -> str:
        """One line for logs and the CLI."""
        dropped = []
        if self.duplicate_rows:
            dropped.append(f"{self.duplicate_rows} duplicate rows")
        if self.padding_rows:
            dropped.append(f"{self.padding_rows} padding rows")
        note = f", dropped {' and '.join(dropped)}" if dropped else ""
        return (
            f"imported {self.rows} rows, {self.episodes} episodes, {len(self.tasks)} task(s), "
            f"{len(self.modules)} module(s) from {self.source_rows} source rows{note} into "
            f"{self.out} ({self.files} file(s), fingerprint {self.fingerprint[:12]})"
        )


def check_output(out: Path) -> None:
    """Refuse an output directory that already holds files, before anything is read."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(
            f"{out} already exists and is not an empty directory; expected a new or empty "
            "directory for the imported dataset (delete it or choose another --out)"
        )


def canonical_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` in canonical column order, ids dictionary-encoded, field metadata dropped."""
    names = [n for n in CANONICAL_ORDER if n in schema.names]
    names += [n for n in schema.names if n not in CANONICAL_ORDER]
    fields = []
    for name in names:
        kind = schema.field(name).type
        if name in _ID_COLUMNS:
            kind = pa.dictionary(pa.int32(), pa.string())
        fields.append(pa.field(name, kind))
    return pa.schema(fields)


def _is_id_like(kind: pa.DataType) -> bool:
    return pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_integer(kind)


class CanonicalWriter:
    """Sorted canonical tables in; a validated dataset directory out (see module doc)."""

    def __init__(
        self,
        out: Path,
        schema: pa.Schema,
        *,
        row_group_rows: int = ROW_GROUP_ROWS,
        file_bytes: int = FILE_BYTES,
        progress: Progress | None = None,
    ) -> None:
        self._out = out
        self._schema = canonical_schema(schema)
        # Dictionary pages pay off for ids, not for floats (tried, then abandoned per page).
        self._dictionary = [f.name for f in self._schema if _is_id_like(f.type)]
        self._row_group_rows = row_group_rows
        self._file_bytes = file_bytes
        self._progress = progress
        self._staging = out.parent / f".{out.name}.importing-{uuid.uuid4().hex[:8]}"
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._files: list[str] = []
        self._rows = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None

    def __enter__(self) -> CanonicalWriter:
        self._staging.mkdir(parents=True)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._close_file()
        shutil.rmtree(self._staging, ignore_errors=True)

    def write(self, table: pa.Table) -> None:
        """Append rows (sorted after every row written before)."""
        if table.num_rows == 0:
            return
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self._row_group_rows:
            merged = pa.concat_tables(self._pending)
            self._write_group(merged.slice(0, self._row_group_rows))
            rest = merged.slice(self._row_group_rows)
            self._pending, self._pending_rows = [rest], rest.num_rows

    def finish(self, metadata: DatasetMetadata, source: SourceFacts) -> ImportSummary:
        """Write the last rows and ``dataset.json``, validate, and move the dataset into place."""
        if self._pending_rows:
            self._write_group(pa.concat_tables(self._pending))
        self._pending, self._pending_rows = [], 0
        self._close_file()
        metadata = metadata.model_copy(update={"num_rows": self._rows, "files": self._files})
        write_metadata(self._staging, metadata)
        info = inspect_episodes(self._staging)
        if self._out.exists():
            self._out.rmdir()  # empty: check_output refused anything else
        os.replace(self._staging, self._out)
        return ImportSummary(
            out=str(self._out),
            rows=info.num_rows,
            episodes=info.num_episodes,
            files=len(info.files),
            tasks=info.task_ids,
            modules=info.module_ids,
            fingerprint=info.fingerprint,
            source_rows=source.source_rows,
            duplicate_rows=source.duplicate_rows,
            padding_rows=source.padding_rows,
            source_fingerprint=source.source_fingerprint,
        )

    def _write_group(self, table: pa.Table) -> None:
        if self._writer is None:
            name = f"part-{len(self._files):05d}.parquet"
            self._sink = pa.OSFile(str(self._staging / name), "wb")
            self._writer = pq.ParquetWriter(
                self._sink, self._schema, compression="zstd", use_dictionary=self._dictionary
            )
            self._files.append(name)
        # One contiguous chunk per column: many small chunks (one per episode) write slowly.
        table = self._conform(table).combine_chunks()
        self._writer.write_table(table, row_group_size=table.num_rows)
        self._rows += table.num_rows
        assert self._sink is not None
        if self._sink.tell() >= self._file_bytes:
            self._close_file()

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            assert self._sink is not None
            self._sink.close()
            if self._progress is not None:
                self._progress(f"wrote {self._files[-1]} ({self._rows} rows so far)")
        self._writer, self._sink = None, None

    def _conform(self, table: pa.Table) -> pa.Table:
        columns = []
        for field in self._schema:
            column = table.column(field.name)
            if field.name in _ID_COLUMNS and not pa.types.is_dictionary(column.type):
                column = pc.dictionary_encode(column.combine_chunks())
            columns.append(column)
        return pa.Table.from_arrays(columns, schema=self._schema)
