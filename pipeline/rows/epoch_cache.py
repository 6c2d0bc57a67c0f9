"""Later epochs of a row stream served from the first epoch's tables, kept in memory.

A row stream's epoch is its files' rows in a seeded file order, re-cut into super-batches
(``pipeline.rows.feed``). Reading and decoding the Parquet files again every epoch
costs the read tasks of every window and most of the cores. When the selected columns
fit a budget, the tables of the first epoch read to its end are kept, cut at file
boundaries, and every later epoch chains them in its own file order: the same rows in the
same order as a re-read, so the same batches, and resume stays exact.

The tables are Ray's blocks, views of the object store's shared memory: keeping them
keeps those objects alive, so the default budget is a share of the object store. Above
the budget nothing is kept, the stream says so in a log line, and every epoch is read
again in windows, two at most in memory (``pipeline.rows.read_ahead``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa

_LOG = logging.getLogger(__name__)

OBJECT_STORE_SHARE = 4
"""The default budget is the object store's capacity divided by this: the cache, the two
windows in flight and whatever else the session keeps there all fit."""


def default_budget_bytes() -> int:
    """A quarter of the running Ray session's object store, in bytes."""
    import ray

    capacity = ray.cluster_resources().get("object_store_memory", 0)
    return int(capacity) // OBJECT_STORE_SHARE


class FileTables:
    """The tables of each file of a dataset, recorded from the first epoch read whole.

    ``file_rows[i]`` is the number of rows file ``i`` gives (its footers' count).
    ``record`` passes an epoch's tables through while keeping them per file; once one
    epoch has been recorded to its end, ``complete`` is true and ``tables`` gives any file
    order's tables without reading. A recording that would hold more than
    ``budget_bytes`` is given up, logged once, and never tried again (``refused``).
    """

    def __init__(self, file_rows: Sequence[int], budget_bytes: int, *, describe: str) -> None:
        self._file_rows = list(file_rows)
        self._budget = budget_bytes
        self._describe = describe
        self._files: list[list[pa.Table]] | None = None
        self.refused = budget_bytes <= 0

    @property
    def complete(self) -> bool:
        return self._files is not None

    def tables(self, order: Sequence[int]) -> Iterator[pa.Table]:
        """The recorded tables of the files at ``order``, in that order."""
        if self._files is None:
            raise RuntimeError("FileTables.tables: no epoch has been recorded to its end")
        for index in order:
            yield from self._files[index]

    def record(self, order: Sequence[int], tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
        """``tables`` (the rows of the files at ``order``, in that order) passed through,
        and kept per file if they fit the budget and are read to their end. Closing this
        generator closes ``tables``."""
        files: list[list[pa.Table]] = [[] for _ in self._file_rows]
        # Rows each file of the epoch has still to give, last file first.
        left = [self._file_rows[index] for index in reversed(order)]
        held, keeping = 0, not self.refused
        blocks = iter(tables)
        try:
            for table in blocks:
                yield table
                if not keeping or not table.num_rows:
                    continue
                if held == 0:
                    # The first table's bytes per row tell the whole epoch's size: refuse
                    # now rather than hold most of an epoch that cannot fit.
                    keeping = self._fits(table.nbytes * sum(self._file_rows) // table.num_rows)
                held += table.nbytes
                keeping = keeping and self._fits(held) and _cut(table, order, left, files)
                if not keeping:
                    files = []  # let go of what was kept: the stream holds two windows again
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()
        if keeping and not any(left):
            self._files = files
            _LOG.info(
                "%s: %s of selected columns kept in memory (cache budget %s); later epochs "
                "read no file",
                self._describe,
                _size(held),
                _size(self._budget),
            )

    def _fits(self, size: int) -> bool:
        if size <= self._budget or self.refused:
            return not self.refused
        self.refused = True
        _LOG.info(
            "%s: not kept in memory for later epochs: its selected columns take about %s, "
            "over the cache budget of %s; every epoch reads the files again (raise "
            "cache_budget_mb to keep them)",
            self._describe,
            _size(size),
            _size(self._budget),
        )
        return False


def _cut(
    table: pa.Table, order: Sequence[int], left: list[int], files: list[list[pa.Table]]
) -> bool:
    """Append the rows of ``table`` to the files they belong to; False when ``table`` has
    more rows than the files still to give (the footers' counts were wrong)."""
    start = 0
    while start < table.num_rows:
        while left and left[-1] == 0:
            left.pop()
        if not left:
            return False
        piece = min(left[-1], table.num_rows - start)
        files[order[len(order) - len(left)]].append(table.slice(start, piece))
        start += piece
        left[-1] -= piece
    return True


def _size(size: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"
