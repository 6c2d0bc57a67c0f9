"""Task samples larger than memory: whole tasks read in windows, one window at a time.

``task_samples(..., mode="stream")`` (or ``"auto"`` over a memory budget) returns a
``TaskWindows``: a plan, not the data. Where each task's rows are comes from the Parquet
footers (``pipeline.tasks.order``, which refuses data not sorted by task); consecutive whole
tasks are packed into windows of at most ``window_rows`` rows.

``read_window(i)`` reads a window's row groups with pyarrow, keeps the rows of the modules
sampled and returns them as in-memory ``TaskSamples`` (sorted like the in-memory path), so
a window is planned exactly as the whole dataset is in memory. With a discount ``gamma``
the window also gets the columns derived at ingest (``pipeline.reads.returns``), computed from
its own sorted rows: a window holds whole tasks, so whole episodes. How windows are mixed
into meta-batches is ``pipeline.tasks.feed.TaskWindowFeed``.

Memory: the budget covers a window read, its sorted copy, the samples carried over from
the previous window (at most one window) and the conversion to arrays, so a window has
``budget / (4 * bytes per row)`` rows. ``held_rows_limit`` (two windows) bounds the rows
the feed holds at once; ``LearnerStream.stats()["max_rows_held"]`` reports them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.contract.integer_range import with_step_type
from pipeline.contract.schema import DatasetError, EpisodeSchema
from pipeline.contract.value_checks import ValueFacts, check_read_values
from pipeline.reads.episodes import DatasetInfo
from pipeline.reads.selection import EpisodeSelection
from pipeline.tasks.episodes import (
    EpisodeSupport,
    check_episode_sizes,
    episode_lengths,
    episode_steps,
    task_samples_of,
)
from pipeline.tasks.grouping import (
    TaskSamples,
    check_task_sizes,
    group_rows,
    grouped_samples,
    no_rows_message,
    of_modules,
    read_names,
    sort_by_task,
    with_inputs,
)
from pipeline.tasks.order import Piece, Span, task_spans

_COPIES = 4
_MB = 2**20
_STRING_BYTES = 16  # an estimate for string ids: offsets plus a short value
_DERIVED_BYTES = 4  # returns is float32; returns_truncated, a bool, rounds up to it


@dataclass(frozen=True)
class Window:
    """Consecutive whole tasks, read together."""

    task_ids: tuple[str, ...]
    pieces: tuple[Piece, ...] = field(repr=False)
    rows: int
    """Rows read (every module)."""
    held_rows: int
    """Rows kept: those of the modules sampled."""
    samples: int
    """Disjoint K + Q samples the window gives per epoch."""


@dataclass(frozen=True, eq=False)
class TaskWindows:
    """Task samples read window by window; build with ``task_samples(mode="stream")`` and
    hand to ``split_for_learners`` for meta-batch streams."""

    support: int
    query: int
    columns: tuple[str, ...]
    """Stored columns, then the derived ones."""
    task_ids: tuple[str, ...]
    """Sorted ids of the tasks that are sampled."""
    module_ids: tuple[str, ...]
    skipped_tasks: dict[str, int]
    """Tasks left out for having fewer than ``support + query`` transitions -> their size."""
    fingerprint: str | None
    memory_budget_mb: float
    window_rows: int
    """The most rows one window reads."""
    windows: tuple[Window, ...] = field(repr=False)
    files: tuple[str, ...] = field(repr=False)
    filesystem: pafs.FileSystem = field(repr=False)
    schema: EpisodeSchema = field(repr=False)
    modules: frozenset[str] | None = field(repr=False)
    """The modules sampled (``None``: all)."""
    derived: tuple[str, ...] = ()
    """Columns derived per window with ``gamma`` (``pipeline.reads.returns``)."""
    gamma: float | None = None
    values: ValueFacts | None = None
    """What validation checked of the values; unless it scanned every row, each window read
    is checked (``pipeline.contract.value_checks.check_read_values``)."""
    episodes: EpisodeSupport | None = None
    """Support sets of episodes (``pipeline.tasks.episodes``); None: of K transitions."""
    selection: EpisodeSelection | None = field(default=None, repr=False)
    """The episodes ``episodes_where`` keeps: a window keeps only their rows, and is planned
    from the rows they have (``pipeline.reads.selection``)."""

    @property
    def samples_per_epoch(self) -> int:
        return sum(window.samples for window in self.windows)

    @property
    def rows_per_sample(self) -> int:
        """As ``TaskSamples.rows_per_sample``."""
        return self.support if self.episodes is not None else self.support + self.query

    @property
    def held_rows_limit(self) -> int:
        """The most rows a stream holds at once: a window and the samples it carries from
        the previous one (see ``pipeline.tasks.feed``)."""
        return 2 * self.window_rows

    def summary(self) -> dict[str, Any]:
        """Plain-JSON description for logs."""
        rows = sum(window.held_rows for window in self.windows)
        return {
            "mode": "stream",
            "support": self.support,
            "query": self.query,
            "tasks": len(self.task_ids),
            "modules": list(self.module_ids),
            "rows": rows,
            "samples_per_epoch": self.samples_per_epoch,
            "unused_rows_per_epoch": rows - self.samples_per_epoch * self.rows_per_sample,
            "skipped_tasks": len(self.skipped_tasks),
            "windows": len(self.windows),
            "window_rows": self.window_rows,
            "memory_budget_mb": self.memory_budget_mb,
            **(self.episodes.describe() if self.episodes is not None else {}),
        }

    def read_window(self, index: int) -> TaskSamples:
        """Window ``index`` in memory, its modules numbered as in ``module_ids``."""
        window = self.windows[index]
        table = sort_by_task(self._read_rows(window))
        if table.num_rows != window.held_rows:
            raise DatasetError(
                f"{self._files_of(window)}: window {index} has {table.num_rows} rows of the "
                f"sampled modules, but {window.held_rows} when task_samples planned it; "
                "the files changed since: build the task samples again"
            )
        return grouped_samples(
            table,
            group_rows(table),
            support=self.support,
            query=self.query,
            stored=self._stored,
            derived=self.derived,
            gamma=self.gamma,
            module_ids=self.module_ids,
            skipped_tasks={},
            fingerprint=self.fingerprint,
            obs_layout=self.schema.obs_layout,
            episodes=self.episodes,
            steps=None if self.episodes is None else self.support // self.episodes.episodes,
        )

    def _read_rows(self, window: Window) -> pa.Table:
        names = read_names(self.schema, with_inputs(self._stored, self.derived))
        on_disk = [self.schema.column_map.get(name, name) for name in names]
        parts = []
        for file_index in dict.fromkeys(piece.file for piece in window.pieces):
            with self.filesystem.open_input_file(self.files[file_index]) as handle:
                parquet = pq.ParquetFile(handle)
                for piece in window.pieces:
                    if piece.file == file_index:
                        group = parquet.read_row_group(piece.row_group, columns=on_disk)
                        parts.append(group.slice(piece.start, piece.stop - piece.start))
        files = [self.files[i] for i in dict.fromkeys(piece.file for piece in window.pieces)]
        table = pa.concat_tables(parts).rename_columns(names)
        table = with_step_type(table, where=", ".join(files))
        table = of_modules(table, self.schema, self.modules)
        if self.selection is not None:
            table = self.selection.keep(table)
        if self.values is not None and not self.values.every_row:
            check_read_values(table, files, self.filesystem, self.schema, self.values)
        return table

    @property
    def _stored(self) -> tuple[str, ...]:
        return self.columns[: len(self.columns) - len(self.derived)]

    def _files_of(self, window: Window) -> str:
        return ", ".join(dict.fromkeys(self.files[piece.file] for piece in window.pieces))


def estimated_bytes(info: DatasetInfo, columns: tuple[str, ...]) -> int:
    """Bytes that ``columns`` of every row take in memory (numpy arrays)."""
    return info.num_rows * _row_bytes(info, columns)


def plan_task_windows(
    info: DatasetInfo,
    *,
    support: int | None,
    query: int,
    columns: tuple[str, ...],
    modules: frozenset[str] | None,
    skip_small_tasks: bool,
    memory_budget_mb: float,
    derived: tuple[str, ...] = (),
    gamma: float | None = None,
    episode_support: EpisodeSupport | None = None,
) -> TaskWindows:
    """Plan the windows of ``info``'s tasks for ``memory_budget_mb`` (see the module);
    ``columns`` are stored ones, ``derived`` are computed per window with ``gamma``. With
    ``episode_support`` the episodes' lengths come from the id columns (read a row group at
    a time), so that each window's samples are known before it is read."""
    schema = info.schema
    row_bytes = _row_bytes(info, read_names(schema, with_inputs(columns, derived)))
    row_bytes += _DERIVED_BYTES * len(derived)
    window_rows = max(1, int(memory_budget_mb * _MB // (_COPIES * row_bytes)))
    spans = task_spans(info)
    if info.selection is not None:
        # Rows of the episodes kept, per task and module: what a window holds once read.
        kept = info.selection.sizes
        spans = [
            replace(span, counts={m: kept.get((m, span.task), 0) for m in span.counts})
            for span in spans
        ]
    groups = sorted(
        (module, span.task, count)
        for span in spans
        for module, count in span.counts.items()
        if (modules is None or module in modules) and count
    )
    if not groups:
        raise DatasetError(no_rows_message(modules))
    group_modules = [module for module, _, _ in groups]
    group_tasks = [task for _, task, _ in groups]
    counts = np.array([count for _, _, count in groups])
    if episode_support is None:
        skipped = check_task_sizes(
            group_tasks, group_modules, counts, support, query, skip_small_tasks
        )
        size = support + query
        samples_of = {(m, t): c // size for m, t, c in groups}
    else:
        lengths = episode_lengths(info, modules)
        skipped = check_episode_sizes(
            episode_support,
            lengths,
            query,
            skip_small_tasks=skip_small_tasks,
        )
        support = episode_support.episodes * episode_steps(
            episode_support, np.concatenate(list(lengths.values())), "task_samples"
        )
        samples_of = {
            key: task_samples_of(episode_support, found, query)[0] for key, found in lengths.items()
        }
    windows = []
    for chunk in _pack(spans, window_rows, row_bytes, memory_budget_mb):
        kept = [
            (module, span.task, count)
            for span in chunk
            for module, count in span.counts.items()
            if modules is None or module in modules
        ]
        windows.append(
            Window(
                task_ids=tuple(span.task for span in chunk),
                pieces=_merged([piece for span in chunk for piece in span.pieces]),
                rows=sum(span.rows for span in chunk),
                held_rows=sum(count for _, _, count in kept),
                samples=sum(samples_of[(module, task)] for module, task, _ in kept),
            )
        )
    return TaskWindows(
        support=support,
        query=query,
        columns=(*columns, *derived),
        task_ids=tuple(sorted({t for m, t, _ in groups if samples_of[(m, t)] > 0})),
        module_ids=tuple(sorted(set(group_modules))),
        skipped_tasks=skipped,
        fingerprint=getattr(info, "fingerprint", None),
        memory_budget_mb=memory_budget_mb,
        window_rows=window_rows,
        windows=tuple(windows),
        files=info.files,
        filesystem=info.filesystem,
        schema=schema,
        modules=modules,
        derived=derived,
        gamma=gamma,
        values=info.values,
        episodes=episode_support,
        selection=info.selection,
    )


def _pack(
    spans: list[Span], window_rows: int, row_bytes: int, memory_budget_mb: float
) -> Iterator[list[Span]]:
    """Consecutive tasks, at most ``window_rows`` rows a window."""
    chunk: list[Span] = []
    rows = 0
    for span in spans:
        if span.rows > window_rows:
            # Rounded up to a kilobyte, so that the budget named is always enough.
            needed = math.ceil(span.rows * _COPIES * row_bytes / _MB * 1000) / 1000
            raise DatasetError(
                f"task_samples: task {span.task!r} has {span.rows} transitions, more than "
                f"a window of {window_rows} rows, the most that memory_budget_mb="
                f"{memory_budget_mb:g} allows at {row_bytes} bytes per row ({_COPIES} "
                f"copies of a window fit in the budget); raise memory_budget_mb to at least "
                f"{needed:g}, or split the task"
            )
        if rows + span.rows > window_rows:
            yield chunk
            chunk, rows = [], 0
        chunk.append(span)
        rows += span.rows
    if chunk:
        yield chunk


def _merged(pieces: list[Piece]) -> tuple[Piece, ...]:
    """Adjacent pieces of one row group as one piece (a row group is read once)."""
    merged: list[Piece] = []
    for piece in pieces:
        last = merged[-1] if merged else None
        if last is not None and (last.file, last.row_group, last.stop) == (
            piece.file,
            piece.row_group,
            piece.start,
        ):
            merged[-1] = Piece(last.file, last.row_group, last.start, piece.stop)
        else:
            merged.append(piece)
    return tuple(merged)


def _row_bytes(info: DatasetInfo, names: list[str] | tuple[str, ...]) -> int:
    schema = pq.read_schema(info.files[0], filesystem=info.filesystem)
    column_map = info.schema.column_map
    return sum(_width(schema.field(column_map.get(name, name)).type) for name in names)


def _width(arrow_type: pa.DataType) -> int:
    if isinstance(arrow_type, pa.BaseExtensionType):
        arrow_type = arrow_type.storage_type
    if pa.types.is_fixed_size_list(arrow_type):
        return arrow_type.list_size * _width(arrow_type.value_type)
    if pa.types.is_dictionary(arrow_type):
        return _width(arrow_type.index_type)
    if pa.types.is_boolean(arrow_type):
        return 1
    try:
        return max(1, arrow_type.bit_width // 8)
    except ValueError:
        return _STRING_BYTES
