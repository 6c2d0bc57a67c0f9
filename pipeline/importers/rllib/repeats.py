"""Drop the repeats of a recorded step from sorted rows, refusing repeats that differ.

RLlib's recorder never empties its buffer, so a step is often written several times. Rows
arrive sorted by (task_id, eps_id, t), the repeats of a step in reading order (the sort's
last key is ``ORIGIN``); the first copy is kept. A repeat must be an exact copy of the copy
before it: two rows with the same key that differ in any column but ``ORIGIN`` are handed
to ``on_conflict``, which raises. A step's copies may straddle two of the sort's tables:
the last row handed out is carried into the next table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.importers.columns import first_difference

STEP_KEYS = ("task_id", "eps_id", "t")
ORIGIN = "_origin"
"""Bookkeeping column: where a row was read (the importer's file index); sorts repeats of
one step in reading order and names the files in conflict messages. Never compared."""
SORT_KEYS = (*STEP_KEYS, ORIGIN)

Conflict = Callable[[pa.Table, int, int, str], NoReturn]
"""``on_conflict(table, first_row, second_row, column)``: raise for two rows of ``table``
with the same key and a different value in ``column``."""


class RepeatedSteps:
    """Counts the repeats it drops (see module doc)."""

    def __init__(self, on_conflict: Conflict) -> None:
        self._on_conflict = on_conflict
        self._last: pa.Table | None = None
        self.dropped = 0

    def unique(self, tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """``tables`` (sorted by ``SORT_KEYS`` as a whole, one schema) with each step once."""
        for table in tables:
            if table.num_rows == 0:
                continue
            carried = self._last is not None
            if self._last is not None:
                table = pa.concat_tables([self._last, table])
            kept = self._drop_repeats(table)
            # A copy of the row, not a slice: a slice would hold the whole table's buffers.
            self._last = kept.take([kept.num_rows - 1])
            if carried:
                kept = kept.slice(1)
            if kept.num_rows:
                yield kept

    def _drop_repeats(self, table: pa.Table) -> pa.Table:
        repeat = _same_step_as_previous(table)
        if not repeat.any():
            return table
        second = np.flatnonzero(repeat) + 1
        first = second - 1
        difference = first_difference(table.drop_columns([ORIGIN]), first, second)
        if difference is not None:
            pair, column = difference
            self._on_conflict(table, int(first[pair]), int(second[pair]), column)
        self.dropped += len(second)
        keep = np.ones(table.num_rows, dtype=bool)
        keep[second] = False
        return table.filter(pa.array(keep))


def _same_step_as_previous(table: pa.Table) -> np.ndarray:
    """``out[i]`` is True when row ``i + 1`` has the same step key as row ``i``."""
    n = table.num_rows
    same = np.ones(max(n - 1, 0), dtype=bool)
    for key in STEP_KEYS:
        column = table.column(key)
        equal = pc.equal(column.slice(1), column.slice(0, n - 1))
        same &= pc.fill_null(equal, False).to_numpy(zero_copy_only=False)
    return same
