"""One pass over id rows in ``(eps_id, module, t)`` order, table by table, holding only the
last row and what the refusals will name (``pipeline.contract.sorted_id_checks`` feeds it).

Each table is checked with the previous table's last row in front of it, so every pair of
neighbouring rows is compared once. The rules are the in-memory checks' rules
(``pipeline.contract.id_checks``) applied in the same order, so the first finding of each
kind is the first row that finds it; counts go on to the end.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from pipeline.contract.id_findings import (
    FLAGS,
    SHOWN_DUPLICATES,
    Repeat,
    RowAt,
    duplicates_error,
    early_end_error,
    episode_label,
    gap_error,
    late_start_error,
    task_change_error,
)


class _Raw(NamedTuple):
    """A row a refusal will name, before it is known whether labels show modules."""

    eps_id: int | str
    module: int | None
    t: int
    file: str


@dataclass
class _Counted:
    """Episodes holding some finding, counted once each; the first finding's rows."""

    count: int = 0
    last_episode: int = -1
    first: tuple[_Raw, ...] = ()

    def add(self, episodes: np.ndarray) -> None:
        distinct = np.unique(episodes)
        if not len(distinct):
            return
        self.count += len(distinct) - int(distinct[0] == self.last_episode)
        self.last_episode = int(distinct[-1])


@dataclass
class _EarlyEnd(_Counted):
    """Early end flags; ``last`` waits for the end of the first one's episode."""

    last: _Raw | None = None


@dataclass
class _Repeated:
    first: _Raw
    rows: int
    files: tuple[str, ...]


@dataclass
class _Repeats:
    rows: int = 0
    """Rows repeating a key seen just before them."""
    shown: list[_Repeated] = field(default_factory=list)
    last_pair: int = -2
    """Sorted position of the last repeated pair seen while listing."""
    listed: bool = False
    """``shown`` is complete."""


@dataclass
class _Batch:
    """A table's rows with the previous last row in front (``carried``)."""

    key: np.ndarray
    module: np.ndarray | None
    t: np.ndarray
    pos: np.ndarray
    flags: dict[str, np.ndarray]
    task: np.ndarray | None
    eps: pa.Array | None
    carried: bool


class Scan:
    """The checks over sorted rows; ``feed`` every table in order, then ``refuse``.

    ``file_starts``, ``module_names`` and ``task_names`` may still grow while rows come
    (rows read straight from the files): only entries for rows already fed are looked up.
    """

    def __init__(
        self,
        *,
        files: Sequence[str],
        file_starts: list[int],
        module_names: list[str] | None,
        task_names: list[str] | None,
    ) -> None:
        self._files, self._file_starts = files, file_starts
        self._module_names, self._task_names = module_names, task_names
        self._last: _Batch | None = None
        self._base = 0
        """Sorted position of the first row of the current batch."""
        self._episode = -1
        """Ordinal of the last row's episode."""
        self.eps_ids = 0
        self.tasks_at_starts: set[int] = set()
        self._repeats = _Repeats()
        self._task_change: tuple[_Raw, _Raw, str, str] | None = None
        self._late = _Counted()
        self._gaps = _Counted()
        self._ends = {flag: _EarlyEnd() for flag in FLAGS}
        self.in_order = True
        """No row fed came before the one before it (false: the findings mean nothing)."""

    def feed(self, table: pa.Table) -> None:
        if table.num_rows == 0 or not self.in_order:
            return
        rows = self._with_last(table)
        key, t = rows.key, rows.t
        # One module's codes are all equal, so comparing them changes nothing.
        same = key[1:] == key[:-1]
        later = key[1:] > key[:-1]
        if rows.module is not None:
            later |= same & (rows.module[1:] > rows.module[:-1])
            same &= rows.module[1:] == rows.module[:-1]
        step = t[1:] - t[:-1]
        # Repeated rows side by side are in order: a stable sort would leave them so.
        if not (later | (same & (step >= 0))).all():
            self.in_order = False
            return
        starts = np.empty(len(key), bool)
        starts[0] = not rows.carried
        starts[1:] = ~same
        episode = self._episode + np.cumsum(starts)
        self.eps_ids += int(np.count_nonzero(key[1:] != key[:-1])) + int(not rows.carried)
        if rows.task is not None:
            self.tasks_at_starts.update(np.unique(rows.task[starts]).tolist())
        self._find_repeats(rows, same & (step == 0))
        if rows.task is not None and self._task_change is None:
            self._find_task_change(rows, same & (rows.task[1:] != rows.task[:-1]))
        self._find_late_starts(rows, np.flatnonzero(starts & (t != 0)))
        gaps = np.flatnonzero(same & (step > 1))
        if len(gaps) and not self._gaps.first:
            self._gaps.first = (self._row(rows, int(gaps[0])), self._row(rows, int(gaps[0]) + 1))
        self._gaps.add(episode[gaps])
        for flag, ends in self._ends.items():
            self._find_early_ends(rows, flag, ends, same, episode)
        self._base += len(key) - 1
        self._episode = int(episode[-1])
        self._last = _last_row(rows)

    def refuse(
        self, description: str, *, allow_partial_episodes: bool, several_modules: bool
    ) -> None:
        """Raise the refusal the in-memory checks would raise first, if any; labels name
        modules when the dataset has ``several_modules``."""

        def at(raw: _Raw) -> RowAt:
            module = None
            if several_modules and raw.module is not None and self._module_names is not None:
                module = self._module_names[raw.module]
            return RowAt(episode_label(raw.eps_id, module), raw.t, raw.file)

        if self._repeats.rows:
            shown = [Repeat(at(r.first), r.rows, r.files) for r in self._repeats.shown]
            raise duplicates_error(description, self._repeats.rows, shown, several_modules)
        if self._task_change is not None:
            before, after, *names = self._task_change
            raise task_change_error(at(before), at(after), *names)
        if allow_partial_episodes:
            return
        if self._late.first:
            raise late_start_error(at(self._late.first[0]), self._late.count)
        if self._gaps.first:
            before, after = self._gaps.first
            raise gap_error(at(before), at(after), self._gaps.count)
        for flag, ends in self._ends.items():
            if ends.first:
                if ends.last is None:
                    assert self._last is not None
                    ends.last = self._row(self._last, 0)
                raise early_end_error(flag, at(ends.first[0]), at(ends.last), ends.count)

    def _with_last(self, table: pa.Table) -> _Batch:
        def column(name: str) -> np.ndarray:
            return table.column(name).to_numpy()

        has_module = "module" in table.column_names
        has_task = "task" in table.column_names
        rows = _Batch(
            key=column("key"),
            module=column("module") if has_module else None,
            t=column("t"),
            pos=column("pos"),
            flags={flag: column(flag) for flag in FLAGS},
            task=column("task") if has_task else None,
            eps=table.column("eps").combine_chunks() if "eps" in table.column_names else None,
            carried=False,
        )
        last = self._last
        if last is None:
            return rows
        return _Batch(
            key=np.concatenate([last.key, rows.key]),
            module=None if rows.module is None else np.concatenate([last.module, rows.module]),
            t=np.concatenate([last.t, rows.t]),
            pos=np.concatenate([last.pos, rows.pos]),
            flags={flag: np.concatenate([last.flags[flag], rows.flags[flag]]) for flag in FLAGS},
            task=None if rows.task is None else np.concatenate([last.task, rows.task]),
            eps=None if rows.eps is None else pa.concat_arrays([last.eps, rows.eps]),
            carried=True,
        )

    def _row(self, rows: _Batch, row: int) -> _Raw:
        eps_id: int | str = int(rows.key[row]) if rows.eps is None else rows.eps[row].as_py()
        module = None if rows.module is None else int(rows.module[row])
        file = bisect.bisect_right(self._file_starts, int(rows.pos[row])) - 1
        return _Raw(eps_id, module, int(rows.t[row]), self._files[file])

    def _find_repeats(self, rows: _Batch, repeated: np.ndarray) -> None:
        """Count repeating rows; list the first keys repeated, each with its rows' files."""
        found = self._repeats
        found.rows += int(np.count_nonzero(repeated))
        if found.listed:
            return
        for pair in np.flatnonzero(repeated).tolist():
            at = self._base + pair
            if found.shown and at == found.last_pair + 1:
                last = found.shown[-1]
                last.files = tuple(dict.fromkeys((*last.files, self._row(rows, pair + 1).file)))
                last.rows += 1
            elif len(found.shown) < SHOWN_DUPLICATES:
                first, second = self._row(rows, pair), self._row(rows, pair + 1)
                files = tuple(dict.fromkeys((first.file, second.file)))
                found.shown.append(_Repeated(first, 2, files))
            else:
                found.listed = True
                return
            found.last_pair = at

    def _find_task_change(self, rows: _Batch, changes: np.ndarray) -> None:
        if not changes.any():
            return
        assert rows.task is not None and self._task_names is not None
        before = int(np.flatnonzero(changes)[0])
        names = [self._task_names[int(rows.task[r])] for r in (before, before + 1)]
        self._task_change = (self._row(rows, before), self._row(rows, before + 1), *names)

    def _find_late_starts(self, rows: _Batch, late: np.ndarray) -> None:
        if len(late) and not self._late.first:
            self._late.first = (self._row(rows, int(late[0])),)
        self._late.count += len(late)

    def _find_early_ends(
        self, rows: _Batch, flag: str, ends: _EarlyEnd, same: np.ndarray, episode: np.ndarray
    ) -> None:
        """Rows flagged with the next row in their episode; the last row waits for the
        next table, which brings its neighbour."""
        if ends.first and ends.last is None:
            boundaries = np.flatnonzero(~same)
            if len(boundaries):
                ends.last = self._row(rows, int(boundaries[0]))
        early = np.flatnonzero(rows.flags[flag][:-1] & same)
        if not len(early):
            return
        ends.add(episode[early])
        if ends.first:
            return
        row = int(early[0])
        ends.first = (self._row(rows, row),)
        boundaries = np.flatnonzero(~same[row:])
        if len(boundaries):
            ends.last = self._row(rows, row + int(boundaries[0]))


def _last_row(rows: _Batch) -> _Batch:
    return _Batch(
        key=rows.key[-1:],
        module=None if rows.module is None else rows.module[-1:],
        t=rows.t[-1:],
        pos=rows.pos[-1:],
        flags={flag: values[-1:] for flag, values in rows.flags.items()},
        task=None if rows.task is None else rows.task[-1:],
        eps=None if rows.eps is None else rows.eps.slice(len(rows.eps) - 1),
        carried=True,
    )
