"""Import a recording of RLlib's offline recorder (new API stack, ``output_write_episodes=False``).

What RLlib 2.60 writes, and what becomes of it:

- ``OUTPUT/<env>/run-<worker>-<n>/*.parquet``, one directory per ``sample()`` call, often one
  row per file. The recorder never empties its buffer, so every write repeats all earlier
  rows: each step is kept once, and a step recorded twice with different values is refused,
  naming the episode, the step and both files.
- No ``t``: steps are numbered per episode in recording order (``rllib_steps``).
- ``obs``/``new_obs`` (and other tensor columns) as Ray's ``ArrowTensorTypeV2`` over
  ``large_list<float>``: read from the storage without Ray, written as
  ``fixed_shape_tensor<float32>``; int32 ``actions`` -> int64; float64 ``rewards`` -> float32.
- ``agent_id``/``module_id`` of type null (single agent) are dropped: every row belongs to
  ``default_policy``. In multi-agent recordings ``module_id`` names each row's module.
- ``task_id``: the ``task_id`` argument, else the name of the ``<env>`` directory.

Memory: chunks of about ``chunk_bytes`` are converted, numbered, sorted and spilled, then
merged (``pipeline.writes.external_sort``, run files in the writer's staging directory); repeats
are dropped from the merged rows (``rllib_repeats``); besides those, one small cursor per
episode.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import NamedTuple, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract.dataset_json import DatasetMetadata, GeneratorInfo, Space
from pipeline.contract.schema import DatasetError
from pipeline.importers.columns import row_hashes
from pipeline.importers.output import ImportSummary, SourceFacts, check_output, import_summary
from pipeline.importers.recording_files import SourceFingerprint, walk
from pipeline.importers.remote_recording import is_remote, local_copy
from pipeline.importers.rllib.repeats import ORIGIN, SORT_KEYS, RepeatedSteps
from pipeline.importers.rllib.rows import canonical_rows
from pipeline.importers.rllib.steps import StepNumbering
from pipeline.writes.external_sort import sort_tables
from pipeline.writes.writer import DatasetWriter, Progress

CHUNK_BYTES = 64 << 20
GENERATOR = "offmeta data import rllib"
_SUFFIXES = (".parquet",)
_PROGRESS_FILES = 10_000
_FILES_PER_PIECE = 1024
_PIECES = 8
"""Pieces per chunk: conversion copies a piece a few times, so pieces stay small."""


def import_rllib(
    src: str | Path,
    out: str | Path,
    *,
    task_id: str | None = None,
    progress: Progress | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> ImportSummary:
    """Convert the RLlib offline recording under ``src`` into a canonical dataset at ``out``.

    ``src`` is the recorder's output directory, one ``<env>`` directory in it, or one
    ``run-*`` directory. Raises ``DatasetError`` for input that cannot be converted and
    ``ValueError`` when ``out`` already holds files; nothing is written then. An
    ``s3://`` (or other remote) ``src`` is imported from a temporary local copy
    (``remote_source``).
    """
    options = {"task_id": task_id, "progress": progress, "chunk_bytes": chunk_bytes}
    if is_remote(src):
        check_output(Path(out).absolute())
        with local_copy(str(src), Path(out).absolute().parent) as copy:
            return _import(copy, str(src), Path(out).absolute(), **options)
    return _import(Path(src).absolute(), str(src), Path(out).absolute(), **options)


def _import(
    src: Path,
    given: str,
    out: Path,
    *,
    task_id: str | None,
    progress: Progress | None,
    chunk_bytes: int,
) -> ImportSummary:
    if not src.exists():
        raise DatasetError(f"{src} does not exist; expected an RLlib recording directory")
    check_output(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recording = _Recording(src, given, task_id)
    repeats = RepeatedSteps(recording.refuse_conflict)
    with DatasetWriter(out, purpose="importing", progress=progress) as writer:
        chunks = recording.chunks(chunk_bytes, progress)
        ordered = sort_tables(chunks, SORT_KEYS, run_bytes=chunk_bytes, scratch=writer.scratch)
        for table in repeats.unique(ordered):
            recording.check_modules(table)
            writer.write(table.select(recording.columns()))
        writer.finish(recording.metadata())
        return import_summary(
            writer.publish(),
            SourceFacts(
                source_rows=recording.rows,
                duplicate_rows=repeats.dropped,
                padding_rows=0,
                source_fingerprint=recording.fingerprint.hexdigest(),
            ),
        )


class _Part(NamedTuple):
    """Rows of one row group of one recorder file, as read."""

    index: int
    """The file's position in reading order (its ``ORIGIN``)."""
    path: Path
    write: int
    """Position of the file's write (``run-*`` directory) in reading order."""
    table: pa.Table


class _Recording:
    """Reads the recording in order and hands out canonical, step-numbered chunks."""

    def __init__(self, src: Path, given: str, task_id: str | None) -> None:
        self.src = src
        self.given = given
        self.task_id = task_id
        self.tasks: set[str] = set()
        self.fingerprint = SourceFingerprint(src)
        self.files = 0
        self.rows = 0
        self._steps = StepNumbering()
        self._first_obs: tuple[str, pa.DataType] | None = None
        self._schema: pa.Schema | None = None

    def chunks(self, chunk_bytes: int, progress: Progress | None) -> Iterator[pa.Table]:
        """Canonical tables with ``t`` and ``ORIGIN`` (file index), about ``chunk_bytes``
        each, in recording order. Files are converted in pieces of an eighth of that, or of
        ``_FILES_PER_PIECE`` files (one Arrow table per, often one-row, file costs more
        memory than its rows)."""
        pending: list[_Part] = []
        converted: list[pa.Table] = []
        pending_bytes, converted_bytes, write, directory = 0, 0, -1, None
        for index, path in enumerate(walk(self.src, _SUFFIXES)):
            if path.parent != directory:
                write, directory = write + 1, path.parent
            for table in self._read(path, index):
                pending.append(_Part(index, path, write, table))
                pending_bytes += table.nbytes
                self.rows += table.num_rows
            self.files = index + 1
            if progress is not None and self.files % _PROGRESS_FILES == 0:
                progress(f"rllib: read {self.files} files, {self.rows} rows")
            if len(pending) >= _FILES_PER_PIECE or pending_bytes * _PIECES >= chunk_bytes:
                converted.append(self._convert(pending))
                converted_bytes += converted[-1].nbytes
                pending, pending_bytes = [], 0
            if converted_bytes >= chunk_bytes:
                yield self._unified(pa.concat_tables(converted, promote_options="permissive"))
                converted, converted_bytes = [], 0
        if pending:
            converted.append(self._convert(pending))
        if converted:
            yield self._unified(pa.concat_tables(converted, promote_options="permissive"))
        if progress is not None:
            progress(f"rllib: read {self.files} files, {self.rows} rows; sorting")
        if self.files == 0:
            raise DatasetError(
                f"no Parquet files found under {self.src}; expected the recorder's "
                "OUTPUT/<env>/run-*/*.parquet files (config.offline_data(output=...))"
            )

    def _unified(self, chunk: pa.Table) -> pa.Table:
        """``chunk``, once its columns' types are known to agree with earlier chunks'."""
        schemas = [chunk.schema] if self._schema is None else [self._schema, chunk.schema]
        try:
            self._schema = pa.unify_schemas(schemas, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DatasetError(
                f"{self.src}: files of the recording disagree on column types ({exc}); "
                "expected one type per column"
            ) from None
        return chunk

    def columns(self) -> list[str]:
        """The columns written: every column read, bar ``ORIGIN`` and those null in every
        file."""
        assert self._schema is not None
        return [f.name for f in self._schema if f.name != ORIGIN and not pa.types.is_null(f.type)]

    def _read(self, path: Path, index: int) -> Iterator[pa.Table]:
        source = self.fingerprint.read(path)
        try:
            handle = pq.ParquetFile(
                pa.BufferReader(source) if isinstance(source, pa.Buffer) else source
            )
            for group in range(handle.num_row_groups):
                table = handle.read_row_group(group)
                origin = pa.array(np.full(table.num_rows, index, dtype=np.int64))
                yield table.append_column(ORIGIN, origin)
        except (pa.ArrowInvalid, OSError) as exc:
            raise DatasetError(
                f"{path}: not readable as Parquet ({' '.join(str(exc).split())}); expected "
                "the recorder's Parquet files"
            ) from None

    def _convert(self, pending: list[_Part]) -> pa.Table:
        paths = {part.index: part.path for part in pending}
        converted, writes = [], []
        for group in _same_schema_runs(pending):
            first = group[0].path
            where = str(first) if len(group) == 1 else f"{first} (and {len(group) - 1} more files)"
            task = self.task_id or first.parent.parent.name
            self.tasks.add(task)
            table = canonical_rows(pa.concat_tables([part.table for part in group]), where, task)
            self._check_obs(table, where)
            converted.append(table)
            writes.extend(np.full(part.table.num_rows, part.write) for part in group)
        table = pa.concat_tables(converted, promote_options="permissive")
        origins = table.column(ORIGIN).to_numpy()

        def where_row(row: int) -> str:
            return str(paths[int(origins[row])])

        obs = row_hashes(table.column("obs").combine_chunks())
        new_obs = (
            row_hashes(table.column("new_obs").combine_chunks())
            if "new_obs" in table.column_names
            else None
        )
        eps_id = table.column("eps_id").combine_chunks()
        steps = self._steps.number(eps_id, np.concatenate(writes), obs, new_obs, where_row)
        return table.add_column(1, "t", pa.array(steps, pa.int32()))

    def _check_obs(self, table: pa.Table, where: str) -> None:
        kind = table.schema.field("obs").type
        if self._first_obs is None:
            self._first_obs = (where, kind)
        elif kind != self._first_obs[1]:
            raise DatasetError(
                f"{where}: column 'obs' holds {kind}; expected {self._first_obs[1]} as in "
                f"{self._first_obs[0]} (one observation shape per recording)"
            )

    def check_modules(self, table: pa.Table) -> None:
        if "module_id" not in table.column_names or not table.column("module_id").null_count:
            return
        row = int(
            np.flatnonzero(table.column("module_id").is_null().to_numpy(zero_copy_only=False))[0]
        )
        raise DatasetError(
            f"{self._path(table.column(ORIGIN)[row].as_py())}: column 'module_id' is null or "
            "missing while other files of the recording name modules; expected every row of a "
            "multi-agent recording to name its module"
        )

    def refuse_conflict(self, table: pa.Table, first: int, second: int, column: str) -> NoReturn:
        eps_id, step = table.column("eps_id")[first].as_py(), table.column("t")[first].as_py()
        first_file = self._path(table.column(ORIGIN)[first].as_py())
        second_file = self._path(table.column(ORIGIN)[second].as_py())
        raise DatasetError(
            f"{second_file}: episode '{eps_id}' step {step} is recorded twice with different "
            f"values in column '{column}' (first in {first_file}); expected a repeated step to "
            "be an exact copy, as RLlib's recorder rewrites it (remove one of the two recordings)"
        )

    def metadata(self) -> DatasetMetadata:
        assert self._schema is not None
        schema = self._schema
        obs_shape = tuple(schema.field("obs").type.shape)
        actions = schema.field("actions").type
        if pa.types.is_integer(actions):
            action_space = Space(kind="discrete")
        else:
            action_space = Space(kind="box", shape=tuple(actions.shape))
        dataset_id = next(iter(self.tasks)) if len(self.tasks) == 1 else self.src.name
        return DatasetMetadata(
            id=dataset_id,
            description=f"RLlib offline recording of {', '.join(sorted(self.tasks))}",
            observation_space=Space(kind="box", shape=obs_shape),
            action_space=action_space,
            generator=GeneratorInfo(
                name=GENERATOR,
                args={
                    "source": self.given,
                    "source_fingerprint": self.fingerprint.hexdigest(),
                    "task_id": self.task_id,
                },
            ),
        )

    def _path(self, index: int) -> str:
        """The file with this reading index (the walk is repeated: paths are not kept)."""
        return str(next(islice(walk(self.src, _SUFFIXES), index, None)))


def _same_schema_runs(pending: list[_Part]) -> Iterator[list[_Part]]:
    """Consecutive parts of one schema and one environment directory (converted together:
    one conversion per run of files instead of one per, often one-row, file)."""
    group = [pending[0]]
    for part in pending[1:]:
        first = group[0]
        if part.table.schema.equals(first.table.schema, check_metadata=True) and (
            part.path.parent.parent == first.path.parent.parent
        ):
            group.append(part)
        else:
            yield group
            group = [part]
    yield group
