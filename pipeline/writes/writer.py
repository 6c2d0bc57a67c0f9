"""Write sorted rows as a canonical dataset: well-sized Parquet files and one
``dataset.json``, staged beside the output, validated, then renamed into place.

Rows arrive already sorted by (task, episode, t) in tables of any size; they leave in row
groups of ``ROW_GROUP_ROWS`` rows (fewer when rows are wide: at most ``ROW_GROUP_BYTES`` in
memory) and ``part-NNNNN.parquet`` files of about ``FILE_BYTES`` bytes, columns in
canonical order, ``task_id``/``module_id`` dictionary-encoded, zstd with dictionary pages for
id columns only. Everything is written into a hidden directory next to the output, checked
with ``inspect_episodes`` (the checks ``offmeta data validate`` runs), and renamed into place
only by ``publish``: a refused or failed run leaves nothing behind. ``offmeta data import``
and ``offmeta data compact`` write through it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract.dataset_json import DatasetMetadata, write_metadata
from pipeline.contract.schema import OPTIONAL_COLUMNS, REQUIRED_COLUMNS, DatasetError
from pipeline.reads.episodes import DatasetInfo, inspect_episodes

ROW_GROUP_ROWS = 65_536
FILE_BYTES = 128 << 20
"""Target size of a file on disk (a file ends after the row group that reaches it)."""
ROW_GROUP_BYTES = 128 << 20
"""A row group also ends at this many bytes in memory (wide rows: images)."""
CANONICAL_ORDER = (*REQUIRED_COLUMNS, *OPTIONAL_COLUMNS)
_ID_COLUMNS = ("task_id", "module_id")

Progress = Callable[[str], None]


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


class DatasetWriter:
    """Sorted tables in; a validated dataset directory at ``out`` (see module doc).

    ``scratch`` is a directory beside the staged dataset for the caller's temporary files
    (an external sort's runs), removed with it.
    """

    def __init__(
        self,
        out: Path,
        *,
        purpose: str,
        row_group_rows: int = ROW_GROUP_ROWS,
        file_bytes: int = FILE_BYTES,
        progress: Progress | None = None,
    ) -> None:
        """``purpose`` names the hidden staging directory (``.OUT.PURPOSE-XXXXXXXX``)."""
        self._out = out
        self._purpose = purpose
        self._row_group_rows = row_group_rows
        self._file_bytes = file_bytes
        self._progress = progress
        self._work: Path | None = None
        self._schema: pa.Schema | None = None
        self._dictionary: list[str] = []
        self._group_rows = row_group_rows
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._files: list[str] = []
        self._rows = 0
        self._sink: pa.NativeFile | None = None
        self._writer: pq.ParquetWriter | None = None
        self._staged: DatasetInfo | None = None

    def __enter__(self) -> DatasetWriter:
        prefix = f".{self._out.name}.{self._purpose}-"
        self._work = Path(tempfile.mkdtemp(prefix=prefix, dir=self._out.parent))
        self._data.mkdir()
        self.scratch.mkdir()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._writer is not None and self._sink is not None:
            self._writer.close()
            self._sink.close()
        assert self._work is not None
        shutil.rmtree(self._work, ignore_errors=True)

    @property
    def scratch(self) -> Path:
        assert self._work is not None, "use DatasetWriter in a with block"
        return self._work / "scratch"

    @property
    def _data(self) -> Path:
        assert self._work is not None, "use DatasetWriter in a with block"
        return self._work / "data"

    def write(self, table: pa.Table) -> None:
        """Append rows (sorted after every row written before); the first table's columns
        set the files' schema, later tables are cast to it."""
        if table.num_rows == 0:
            return
        if self._schema is None:
            self._start(table)
        self._pending.append(table)
        self._pending_rows += table.num_rows
        while self._pending_rows >= self._group_rows:
            merged = pa.concat_tables(self._pending)
            self._write_group(merged.slice(0, self._group_rows))
            rest = merged.slice(self._group_rows)
            self._pending, self._pending_rows = [rest], rest.num_rows

    def finish(self, metadata: DatasetMetadata) -> DatasetInfo:
        """Write the last rows and ``dataset.json`` (``metadata`` with ``num_rows`` and
        ``files`` filled in) and validate the staged dataset; ``publish`` moves it."""
        if self._pending_rows:
            self._write_group(pa.concat_tables(self._pending))
        self._pending, self._pending_rows = [], 0
        self._close_file()
        metadata = metadata.model_copy(update={"num_rows": self._rows, "files": self._files})
        write_metadata(self._data, metadata)
        try:
            self._staged = inspect_episodes(self._data)
        except DatasetError as exc:
            # The staging directory goes when the with block ends: name the files where
            # they would have been published, as `offmeta data validate OUT` would.
            raise DatasetError(str(exc).replace(str(self._data), str(self._out))) from None
        return self._staged

    def publish(self) -> DatasetInfo:
        """Rename the finished dataset to ``out`` (an empty directory there is replaced)
        and describe it there."""
        assert self._staged is not None, "finish before publish"
        if self._out.exists():
            self._out.rmdir()  # the callers refuse anything but an empty directory
        os.replace(self._data, self._out)
        moved = tuple(str(self._out / Path(path).name) for path in self._staged.files)
        return dataclasses.replace(self._staged, root=str(self._out), files=moved)

    def _start(self, table: pa.Table) -> None:
        self._schema = canonical_schema(table.schema)
        # Dictionary pages pay off for ids, not for floats (tried, then abandoned per page).
        self._dictionary = [f.name for f in self._schema if _is_id_like(f.type)]
        per_row = max(1, table.nbytes // table.num_rows)
        self._group_rows = max(1, min(self._row_group_rows, ROW_GROUP_BYTES // per_row))

    def _write_group(self, table: pa.Table) -> None:
        assert self._schema is not None
        if self._writer is None:
            name = f"part-{len(self._files):05d}.parquet"
            self._sink = pa.OSFile(str(self._data / name), "wb")
            self._writer = pq.ParquetWriter(
                self._sink, self._schema, compression="zstd", use_dictionary=self._dictionary
            )
            self._files.append(name)
        # One contiguous chunk per column: many small chunks (one per episode) write slowly.
        table = _conformed(table, self._schema).combine_chunks()
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


def _is_id_like(kind: pa.DataType) -> bool:
    return pa.types.is_dictionary(kind) or pa.types.is_string(kind) or pa.types.is_integer(kind)


def _conformed(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = []
    for field in schema:
        column = table.column(field.name)
        if column.type != field.type:
            if pa.types.is_dictionary(field.type) and not pa.types.is_dictionary(column.type):
                column = pc.dictionary_encode(column.combine_chunks())
            column = column.cast(field.type)
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=schema)
