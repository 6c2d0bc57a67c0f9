"""Check that rows form episodes, across the whole dataset, reading only the id columns.

An episode is one module's steps under one ``eps_id``: in multi-agent data several modules
(agents) share an episode id and step index, one row each. Without a ``module_id`` column,
or with one module in it, an episode is an ``eps_id``.

An episode may span files, so the checks see every file's ``eps_id``, ``t``, flags,
``task_id`` and ``module_id``. Here, while ``rows * IN_MEMORY_BYTES_PER_ROW`` fits the
budget (``data.validation_memory_mb``), they are held at once: string ids are
dictionary-encoded (codes in order of first appearance, int64 episode ids are their own
codes), rows are put in ``(eps_id, module, t)`` order by one stable sort of a combined
int64 key (skipped when the rows already are in that order, as writers produce them), and
every rule is a comparison of neighbouring rows. Larger datasets go to
``pipeline.contract.sorted_id_checks``, which finds the same in bounded memory. Tensor
columns are never read.

Always refused: a repeated ``(module_id, eps_id, t)`` and an episode whose ``task_id``
changes. Refused unless ``allow_partial_episodes``: an episode that does not start at
``t = 0``, a step missing inside an episode, and an episode-end flag on a step that is not
its last.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.footer_checks import read_columns
from pipeline.contract.id_findings import (
    FLAGS,
    SHOWN_DUPLICATES,
    VALIDATION_MEMORY_MB,
    EpisodeIds,
    Repeat,
    RowAt,
    duplicates_error,
    early_end_error,
    episode_label,
    gap_error,
    id_columns,
    late_start_error,
    task_change_error,
)
from pipeline.contract.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, EpisodeSchema
from pipeline.contract.sorted_id_checks import check_sorted_episodes
from pipeline.io.dataset_source import ResolvedSource

IN_MEMORY_BYTES_PER_ROW = {"int64": 80, "string": 160}
"""What the in-memory checks peak at per row (ids, codes, order, flags), by ``eps_id`` type:
a dataset whose rows times this exceed the budget is checked over an external sort instead.
String ids also hold their text and its dictionary (measured: 135 bytes a row of peak RSS
for 1M rows of 8-character ids with a task column)."""


@dataclass(frozen=True)
class _Rows:
    """Every row of the dataset in ``(eps_id, module, t)`` order."""

    codes: np.ndarray
    """The ``eps_id`` of each row: the id itself (int64 ids) or its index in ``names``."""
    names: pa.Array | None
    """String ``eps_id`` values in order of first appearance; None for int64 ids."""
    modules: np.ndarray | None
    """Index into ``module_names``; None unless the dataset has several modules."""
    module_names: pa.Array | None
    t: np.ndarray
    same: np.ndarray
    """``same[i]``: rows ``i`` and ``i + 1`` belong to one episode (``eps_id`` and module)."""
    step: np.ndarray
    """``t[i + 1] - t[i]``."""
    ends: dict[str, np.ndarray]
    """Flag column -> ascending positions of the rows that set it."""
    file: np.ndarray
    """Index into ``files``."""
    tasks: np.ndarray | None
    """Index into ``task_names``; None without a ``task_id`` column."""
    task_names: pa.Array | None
    files: Sequence[str]

    def episode(self, row: int) -> str:
        """The episode of ``row`` in messages: its ``eps_id``, after its module when the
        dataset has several."""
        code = int(self.codes[row])
        eps_id = code if self.names is None else self.names[code].as_py()
        if self.modules is None or self.module_names is None:
            return episode_label(eps_id, None)
        return episode_label(eps_id, self.module_names[int(self.modules[row])].as_py())

    def where(self, row: int) -> str:
        return self.files[int(self.file[row])]


def check_episodes(
    resolved: ResolvedSource,
    schema: EpisodeSchema,
    *,
    num_rows: int,
    allow_partial_episodes: bool = False,
    memory_mb: float = VALIDATION_MEMORY_MB,
) -> EpisodeIds:
    """Refuse repeated transitions and broken episodes; count episodes, tasks and modules.

    ``num_rows`` (from the footers) decides how: in memory while ``num_rows *
    IN_MEMORY_BYTES_PER_ROW[eps_id type]`` fits in ``memory_mb``, else over an external
    sort in about ``memory_mb`` whatever the row count (``pipeline.contract.sorted_id_checks``);
    both find the same and say it in the same words. Raises ``DatasetError`` naming the episode, the
    step and the file.
    """
    budget = int(memory_mb * 2**20)
    if num_rows * IN_MEMORY_BYTES_PER_ROW[schema.eps_id_type] > budget:
        return check_sorted_episodes(
            resolved, schema, allow_partial_episodes=allow_partial_episodes, memory_bytes=budget
        )
    columns = _read_columns(resolved, schema)
    rows = _in_order(columns, resolved.files)
    same, step = rows.same, rows.step
    firsts = np.flatnonzero(np.concatenate(([len(rows.t) > 0], ~same)))
    _refuse_duplicates(rows, same & (step == 0), resolved.description)
    if rows.tasks is not None:
        _refuse_task_changes(rows, same & (rows.tasks[1:] != rows.tasks[:-1]))
    if not allow_partial_episodes:
        _refuse_late_starts(rows, firsts[rows.t[firsts] != 0])
        _refuse_gaps(rows, np.flatnonzero(same & (step > 1)))
        for flag, ends in rows.ends.items():
            ends = ends[ends < len(same)]
            _refuse_early_ends(rows, flag, ends[same[ends]])
    return EpisodeIds(_count_eps_ids(rows, firsts), _task_ids(rows, firsts), columns.module_ids)


@dataclass(frozen=True)
class _Columns:
    """The id columns of every file, one after the other in file order."""

    codes: np.ndarray
    names: pa.Array | None
    modules: np.ndarray | None
    """Module code of each row; None with fewer than two modules, whose episodes are their
    ``eps_id`` alone."""
    module_names: pa.Array | None
    t: np.ndarray
    file: np.ndarray
    ends: dict[str, np.ndarray]
    """Flag column -> ascending row numbers of the rows that set it."""
    tasks: np.ndarray | None
    task_names: pa.Array | None
    module_ids: tuple[str, ...]


def _read_columns(resolved: ResolvedSource, schema: EpisodeSchema) -> _Columns:
    """Read file by file, keeping compact copies (numpy arrays, dictionary indices) and
    dropping each file's Arrow table (the checks peak at about 80 bytes per row with int64
    ids, ``IN_MEMORY_BYTES_PER_ROW``)."""
    steps, int_ids, string_ids, tasks, modules = [], [], [], [], []
    ends: dict[str, list[np.ndarray]] = {flag: [] for flag in FLAGS}
    counts = []
    for path in resolved.files:
        table = _read_ids(path, resolved, schema)
        steps.append(table.column("t").to_numpy().astype(np.int64, copy=False))
        episodes = table.column("eps_id")
        if pa.types.is_integer(episodes.type):
            int_ids.append(episodes.to_numpy())
        else:
            string_ids.extend(_dictionary_chunks(episodes))
        for flag in FLAGS:
            flagged = pc.indices_nonzero(table.column(flag)).to_numpy()
            ends[flag].append(flagged + sum(counts))
        if schema.has_task_id:
            tasks.extend(_dictionary_chunks(table.column("task_id")))
        if schema.has_module_id:
            modules.extend(_dictionary_chunks(table.column("module_id")))
        counts.append(table.num_rows)
    codes, names = (np.concatenate(int_ids), None) if int_ids else _codes(string_ids)
    task_codes, task_names = _codes(tasks) if schema.has_task_id else (None, None)
    module_codes, module_names = _codes(modules) if schema.has_module_id else (None, None)
    module_ids = (DEFAULT_MODULE_ID,)
    if module_codes is not None and module_names is not None:
        module_ids = _used(module_codes, module_names)
        if len(module_ids) < 2:
            module_codes = module_names = None
    return _Columns(
        codes=codes,
        names=names,
        modules=module_codes,
        module_names=module_names,
        t=np.concatenate(steps),
        file=np.repeat(np.arange(len(counts), dtype=np.int32), counts),
        ends={flag: np.concatenate(parts) for flag, parts in ends.items()},
        tasks=task_codes,
        task_names=task_names,
        module_ids=module_ids,
    )


def _read_ids(path: str, resolved: ResolvedSource, schema: EpisodeSchema) -> pa.Table:
    canonical, on_disk = id_columns(schema)
    return read_columns(resolved, path, on_disk).rename_columns(canonical)


def _dictionary_chunks(column: pa.ChunkedArray) -> list[pa.Array]:
    """Strings as dictionary indices (4 bytes a row) over the file's distinct values."""
    if not pa.types.is_dictionary(column.type):
        column = pc.dictionary_encode(column)
    return column.chunks


def _codes(chunks: list[pa.Array]) -> tuple[np.ndarray, pa.Array]:
    """One code per row and the distinct values they index; equal values share one code,
    in order of first appearance (every file brings its own dictionary)."""
    if not chunks:
        return np.zeros(0, np.int32), pa.array([], pa.string())
    unified = pa.table({"values": pa.chunked_array(chunks)}).unify_dictionaries().column(0)
    codes = np.concatenate([chunk.indices.to_numpy() for chunk in unified.chunks])
    return codes, unified.chunks[0].dictionary


def _used(codes: np.ndarray, names: pa.Array) -> tuple[str, ...]:
    """The values that occur, sorted (a file's dictionary may hold more)."""
    used = np.bincount(codes, minlength=len(names)) > 0
    return tuple(sorted(names.filter(pa.array(used)).to_pylist()))


def _in_order(columns: _Columns, files: Sequence[str]) -> _Rows:
    """The rows in ``(eps_id, module, t)`` order; writers keep episodes together and in step
    order, and then no row moves."""
    codes, modules, t = columns.codes, columns.modules, columns.t
    same, step = _same_episode(codes, modules), t[1:] - t[:-1]
    order = position = None
    if not _ordered(codes, modules, same, step):
        order = _order(codes, modules, t)
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        codes, t = codes[order], t[order]
        modules = None if modules is None else modules[order]
        same, step = _same_episode(codes, modules), t[1:] - t[:-1]
    return _Rows(
        codes=codes,
        names=columns.names,
        modules=modules,
        module_names=columns.module_names,
        t=t,
        same=same,
        step=step,
        ends={
            flag: rows if position is None else np.sort(position[rows])
            for flag, rows in columns.ends.items()
        },
        file=columns.file if order is None else columns.file[order],
        tasks=columns.tasks if order is None or columns.tasks is None else columns.tasks[order],
        task_names=columns.task_names,
        files=files,
    )


def _same_episode(codes: np.ndarray, modules: np.ndarray | None) -> np.ndarray:
    """Whether each row and the next share ``eps_id`` and module."""
    same = codes[1:] == codes[:-1]
    if modules is not None:
        same &= modules[1:] == modules[:-1]
    return same


def _ordered(
    codes: np.ndarray, modules: np.ndarray | None, same: np.ndarray, step: np.ndarray
) -> bool:
    """Whether every row comes after the previous one in ``(eps_id, module, t)`` order."""
    later = codes[1:] > codes[:-1]
    if modules is not None:
        later |= (codes[1:] == codes[:-1]) & (modules[1:] > modules[:-1])
    return bool((later | (same & (step > 0))).all())


def _order(codes: np.ndarray, modules: np.ndarray | None, t: np.ndarray) -> np.ndarray:
    """Stable ``(eps_id, module, t)`` order: one sort of a combined int64 key when it fits
    (about twice as fast as ``lexsort`` here)."""
    first_code, first_t = int(codes.min()), int(t.min())
    episodes, steps = int(codes.max()) - first_code + 1, int(t.max()) - first_t + 1
    num_modules = 1 if modules is None else int(modules.max()) + 1
    if episodes * num_modules * steps >= 2**62:
        return np.lexsort((t, codes) if modules is None else (t, modules, codes))
    key = codes.astype(np.int64) - first_code
    if modules is not None:
        key *= num_modules
        key += modules
    key *= steps
    key += t - first_t
    return np.argsort(key, kind="stable")


def _count_eps_ids(rows: _Rows, firsts: np.ndarray) -> int:
    """Distinct ``eps_id`` among the episode starts: the episodes of one ``eps_id`` (one per
    module) are neighbours in ``(eps_id, module, t)`` order."""
    starts = rows.codes[firsts]
    return int(np.count_nonzero(starts[1:] != starts[:-1])) + int(len(starts) > 0)


def _count_episodes(rows: _Rows, positions: np.ndarray) -> int:
    """Distinct episodes holding the rows at ``positions``."""
    return len(np.unique(np.searchsorted(np.flatnonzero(~rows.same), positions)))


def _task_ids(rows: _Rows, firsts: np.ndarray) -> tuple[str, ...]:
    """Tasks that occur (a dictionary may hold more), read at episode starts: an episode
    has one task, checked before."""
    if rows.tasks is None or rows.task_names is None:
        return (DEFAULT_TASK_ID,)
    return _used(rows.tasks[firsts], rows.task_names)


def _row_at(rows: _Rows, row: int) -> RowAt:
    return RowAt(rows.episode(row), int(rows.t[row]), rows.where(row))


def _refuse_duplicates(rows: _Rows, repeats: np.ndarray, description: str) -> None:
    if not repeats.any():
        return
    shown = []
    for first in _run_starts(np.flatnonzero(repeats))[:SHOWN_DUPLICATES]:
        last = first
        while last < len(repeats) and repeats[last]:
            last += 1
        where = tuple(dict.fromkeys(rows.where(r) for r in range(first, last + 1)))
        shown.append(Repeat(_row_at(rows, first), last - first + 1, where))
    raise duplicates_error(description, int(repeats.sum()), shown, rows.modules is not None)


def _run_starts(positions: np.ndarray) -> np.ndarray:
    """First position of each run of consecutive positions."""
    keep = np.ones(len(positions), bool)
    keep[1:] = positions[1:] != positions[:-1] + 1
    return positions[keep]


def _refuse_task_changes(rows: _Rows, changes: np.ndarray) -> None:
    if not changes.any():
        return
    before = int(np.flatnonzero(changes)[0])
    after = before + 1
    assert rows.task_names is not None and rows.tasks is not None
    names = [rows.task_names[int(rows.tasks[r])].as_py() for r in (before, after)]
    raise task_change_error(_row_at(rows, before), _row_at(rows, after), *names)


def _refuse_late_starts(rows: _Rows, late: np.ndarray) -> None:
    if len(late):
        raise late_start_error(_row_at(rows, int(late[0])), len(late))


def _refuse_gaps(rows: _Rows, gaps: np.ndarray) -> None:
    if not len(gaps):
        return
    before = int(gaps[0])
    raise gap_error(_row_at(rows, before), _row_at(rows, before + 1), _count_episodes(rows, gaps))


def _refuse_early_ends(rows: _Rows, flag: str, early: np.ndarray) -> None:
    if not len(early):
        return
    row = int(early[0])
    boundaries = np.flatnonzero(~rows.same[row:])
    last = row + int(boundaries[0]) if len(boundaries) else len(rows.codes) - 1
    count = _count_episodes(rows, early)
    raise early_end_error(flag, _row_at(rows, row), _row_at(rows, last), count)
