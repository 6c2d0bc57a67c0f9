"""The row feed: row minibatches for a group of learners, one epoch at a time.

A feed (``pipeline.streams.epoch_feed``) turns ``(epoch, rounds to skip)`` into *deals*:
each deal hands every learner of the group the same number of collated batches. One
producer thread runs the feed for the whole group (``pipeline.streams.group``).

Row feeds take Ray's blocks as Arrow tables the moment they exist (read by plain Ray
tasks, see ``pipeline.rows.file_windows`` and ``pipeline.rows.read_ahead``), re-cut them zero-copy
into super-batches of ``superbatch_rows`` rows, and cut minibatches from those locally.
Ray Data pays a fixed cost of about a millisecond per batch it hands out, so asking it for
512-row batches caps a stream at ~0.3 M rows/s, and even its own 16K-row batches cost the
driver more CPU than the rest of the stream; cutting locally costs microseconds per
minibatch. ``superbatch_rows`` is a multiple of the minibatch size and every super-batch
has exactly that many rows until the epoch ends, so every minibatch is full and only the
epoch's final remainder is dropped (counted). A Ray Train shard (a ``DataIterator``) gives
no access to its blocks and is batched by Ray.

Every epoch reads the files in a new order drawn from ``seed + epoch`` (a materialized
dataset reshuffles its blocks instead) and shuffles the rows inside each super-batch, so
rows mix within a super-batch and files trade places between epochs. When they fit the
cache budget, later epochs chain the first epoch's tables in that order instead of reading
(``pipeline.rows.epoch_cache``): the same rows, the same batches. Where an epoch's
tables come from is ``pipeline.rows.epoch_tables``.

Learners in one process share one read of the data instead of a ``streaming_split``:
minibatches are dealt in rounds (learner ``r`` gets minibatch ``k * N + r`` of the
epoch), so all learners get the same number per epoch, the order depends only on the
seed (exact resume for any number of learners), and no split-coordinator actor sits
between Ray and the learners.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from pipeline.reads.episodes import Episodes
from pipeline.reads.returns import returns_index, split_derived
from pipeline.rows.epoch_tables import BlockEpochs, FileEpochs, shard_superbatches
from pipeline.rows.options import RowStream
from pipeline.streams.collate import Batch, collate_minibatches
from pipeline.streams.columns import module_codes
from pipeline.streams.epoch_feed import Deal
from pipeline.streams.selection import check_modules, resolve_columns


class RowFeed:
    """Row minibatches for ``learners`` learners from Arrow super-batches.

    ``epoch_tables(epoch)`` returns a fresh iterator of super-batches for that epoch;
    ``close`` stops whatever reads ahead of it (the next epoch's first window).
    Super-batch ``i`` of epoch ``e`` is shuffled with ``SFC64((seed + e, i))``: a
    position depends on nothing else, so rounds before a resume point are skipped
    without shuffling or collating them.
    """

    def __init__(
        self,
        epoch_tables: Callable[[int], Iterator[pa.Table]],
        *,
        learners: int,
        minibatch_size: int,
        seed: int,
        columns: Sequence[str] | None,
        modules_to_update: Collection[str] | None,
        pin_memory: bool,
        exact: bool,
        close: Callable[[], None],
    ) -> None:
        self.exact = exact
        self._close = close
        self._epoch_tables = epoch_tables
        self._learners = learners
        self._minibatch_size = minibatch_size
        self._seed = seed
        self._columns = columns
        self._modules_to_update = modules_to_update
        self._pin_memory = pin_memory

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        size, learners = self._minibatch_size, self._learners
        skip_batches = skip * learners
        pending: list[Batch] = []
        tables = self._epoch_tables(epoch)
        try:
            for index, table in enumerate(tables):
                kept = self._trainable_rows(table)
                count = (table.num_rows if kept is None else len(kept)) // size
                unused = table.num_rows - count * size
                if skip_batches >= count:
                    skip_batches -= count
                    yield Deal([[] for _ in range(learners)], table.num_rows, unused)
                    continue
                # SFC64: its permutations cost 25% less than PCG64's (default_rng's).
                rng = np.random.Generator(np.random.SFC64((self._seed + epoch, index)))
                # A permutation of all rows, cut to whole minibatches: rows left over at
                # the end of an epoch are a random sample, not the file's tail.
                order = rng.permutation(table.num_rows if kept is None else len(kept))
                order = (order if kept is None else kept[order])[skip_batches * size : count * size]
                skip_batches = 0
                pending += collate_minibatches(
                    table, order, size, columns=self._columns, pin_memory=self._pin_memory
                )
                rounds = len(pending) // learners * learners
                dealt = [pending[r:rounds:learners] for r in range(learners)]
                pending = pending[rounds:]
                yield Deal(dealt, table.num_rows, unused)
            # Minibatches short of a whole round would give some learners more than others.
            yield Deal([[] for _ in range(learners)], 0, len(pending) * size)
        finally:
            close = getattr(tables, "close", None)
            if close is not None:
                close()

    def close(self) -> None:
        """Stop reading ahead (the next epoch's first window may be reading)."""
        self._close()

    def stats(self) -> dict[str, int]:
        return {}

    def describe_empty(self, epoch: int, rows: int) -> str:
        need = "one minibatch" if self._learners == 1 else f"{self._learners} minibatches"
        return (
            f"epoch {epoch} gave {rows} rows, fewer than {need} of {self._minibatch_size} "
            f"(one for each learner); lower minibatch_size or num_learners, or add data"
        )

    def _trainable_rows(self, table: pa.Table) -> np.ndarray | None:
        """The positions of rows to train on; None for all of them."""
        if self._modules_to_update is None:
            return None
        codes, names = module_codes(table)
        wanted = np.array([name in self._modules_to_update for name in names], dtype=bool)
        return np.flatnonzero(wanted[codes])


def row_feed(
    rows: RowStream, learners: int, *, minibatch_size: int, seed: int, pin_memory: bool
) -> RowFeed:
    """The row feed of ``rows`` for ``learners`` learners. With ``rows.gamma``, rows also
    carry the columns derived at ingest (``pipeline.reads.returns``), looked up by episode
    and step."""
    superbatch_rows = max(
        minibatch_size, rows.superbatch_rows - rows.superbatch_rows % minibatch_size
    )
    options: dict[str, Any] = {
        "learners": learners,
        "minibatch_size": minibatch_size,
        "seed": seed,
        "pin_memory": pin_memory,
    }
    if not isinstance(rows.data, Episodes):
        return _shard_feed(rows, superbatch_rows, **options)
    episodes = rows.data
    chosen = _RowColumns.of(episodes, rows)
    epochs: BlockEpochs | FileEpochs
    if rows.materialize or _is_materialized(episodes):
        epochs = BlockEpochs(episodes, chosen.read, chosen.modules, seed=seed)
    else:
        epochs = FileEpochs(
            episodes, chosen.read, chosen.modules, seed=seed, cache_budget_mb=rows.cache_budget_mb
        )

    def tables(epoch: int) -> Iterator[pa.Table]:
        return cut_tables(epochs.tables(epoch), superbatch_rows)

    if chosen.derived:
        assert rows.gamma is not None  # split_derived refuses derived columns without it
        tables = returns_index(episodes, rows.gamma).wrap(tables, chosen.derived)
    return RowFeed(
        tables,
        columns=(*chosen.stored, *chosen.derived),
        modules_to_update=chosen.modules,
        exact=True,
        close=epochs.close,
        **options,
    )


class _RowColumns(NamedTuple):
    """The columns a row stream delivers and those it reads, checked against the data."""

    stored: tuple[str, ...]
    derived: tuple[str, ...]
    """Computed at ingest from whole episodes (``pipeline.reads.returns``)."""
    read: list[str]
    """The stored columns, and those that group the rows or locate the derived ones."""
    modules: frozenset[str] | None

    @classmethod
    def of(cls, episodes: Episodes, rows: RowStream) -> _RowColumns:
        schema = episodes.schema
        stored, derived = split_derived(rows.columns, rows.gamma)
        chosen = resolve_columns(schema, stored)
        modules = check_modules(rows.modules_to_update, tuple(episodes.module_ids))
        read = [*chosen, *(["module_id"] if schema.has_module_id else [])]
        read = list(dict.fromkeys([*read, *(["eps_id", "t"] if derived else [])]))
        return cls(chosen, derived, read, modules)


def _shard_feed(rows: RowStream, superbatch_rows: int, **options: Any) -> RowFeed:
    """The feed of a Ray Train shard: one learner, read as it comes (not exact)."""
    columns, derived = split_derived(rows.columns, rows.gamma)
    if derived:
        raise ValueError(
            f"columns {list(derived)} are derived from whole episodes, which one "
            "learner's shard does not hold; stream the Episodes (or use task_samples)"
        )
    if options["learners"] != 1 or rows.materialize:
        raise ValueError(
            "a DataIterator is already one learner's shard, read as it comes: expected "
            f"num_learners=1 and no materialize=, got num_learners={options['learners']}"
        )
    shard = rows.data
    return RowFeed(
        lambda epoch: shard_superbatches(shard, superbatch_rows),
        columns=tuple(columns) if columns is not None else None,
        modules_to_update=check_modules(rows.modules_to_update, None),
        exact=False,
        close=lambda: None,
        **options,
    )


def _is_materialized(episodes: Episodes) -> bool:
    from ray.data.dataset import MaterializedDataset

    return isinstance(episodes.dataset, MaterializedDataset)


def cut_tables(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """Re-cut a sequence of tables into tables of exactly ``rows`` rows, in order, and a
    shorter last one; zero-copy (a table spanning two inputs has their chunks)."""
    held: list[pa.Table] = []
    count = 0
    for table in tables:
        start = 0
        while count + table.num_rows - start >= rows:
            held.append(table.slice(start, rows - count))
            start += rows - count
            yield _concat(held)
            held, count = [], 0
        if start < table.num_rows:
            held.append(table.slice(start))
            count += table.num_rows - start
    if count:
        yield _concat(held)


def _concat(tables: list[pa.Table]) -> pa.Table:
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
