"""Where the batches of a group of learners come from, one epoch at a time.

A source turns ``(epoch, rounds to skip)`` into *deals*: each deal hands every learner of
the group the same number of collated batches. One producer thread runs the source for
the whole group (see ``pipeline.streams.learner_stream``); the source knows nothing about threads.

Row sources take Ray's blocks as Arrow tables the moment they exist (read by plain Ray
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
(``pipeline.rows.epoch_cache``): the same rows, the same batches.

Learners in one process share one read of the data instead of a ``streaming_split``:
minibatches are dealt in rounds (learner ``r`` gets minibatch ``k * N + r`` of the
epoch), so all learners get the same number per epoch, the order depends only on the
seed (exact resume for any number of learners), and no split-coordinator actor sits
between Ray and the learners.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.io.parquet_files import file_sizes, group_files
from pipeline.reads.returns import returns_index, split_derived
from pipeline.rows.epoch_cache import FileTables, default_budget_bytes
from pipeline.rows.file_windows import read_window
from pipeline.rows.read_ahead import EpochReads, bundle_blocks, read_ahead
from pipeline.streams.collate import Batch, collate_minibatches, module_codes
from pipeline.streams.selection import check_modules, resolve_columns

# The driver maps every block it reads, so its memory follows the blocks in flight: small
# blocks and windows of files read one ahead keep a streamed epoch flat (Ray's defaults,
# 128 MiB blocks and a budget of a fraction of the object store, let it grow with the
# dataset). A window is cut by size on disk and read by tasks of at most 16 MiB of files (or
# 1,024 small files, see pipeline.reads.file_groups): larger tasks run further ahead of the
# consumer, and with 64 MiB tasks the driver's peak RSS streaming 2M rows from 16 MB files
# was 5% higher (2-core machine).
_STREAM_BLOCK_BYTES = 16 << 20
_WINDOW_BYTES = 128 << 20
_STREAM_TASK_BYTES = 16 << 20


@dataclass(frozen=True)
class Deal:
    """Batches for each learner of the group (equal counts), and the rows behind them."""

    batches: list[list[Any]]
    rows: int
    """Rows (transitions) read for this deal."""
    dropped_rows: int
    """Rows read that no learner gets."""


class EpochSource(Protocol):
    exact: bool
    """True when an epoch's batches depend only on (seed, epoch): resume is exact."""

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        """The epoch's batches after the first ``skip`` rounds (one batch per learner)."""
        ...

    def describe_empty(self, epoch: int, rows: int) -> str:
        """Why epoch ``epoch`` gave no round of batches, after reading ``rows`` rows."""
        ...


class RowSource:
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
        close: Callable[[], None] = lambda: None,
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


def row_source(
    source: Any,
    learners: int,
    *,
    minibatch_size: int,
    seed: int,
    superbatch_rows: int,
    columns: Sequence[str] | None,
    modules_to_update: Collection[str] | None,
    materialize: bool,
    pin_memory: bool,
    gamma: float | None = None,
    cache_budget_mb: float | None = None,
) -> RowSource:
    """A row source over ``Episodes``, or over a Ray ``DataIterator`` that is already one
    learner's shard (Ray Train's ``get_dataset_shard``). With ``gamma``, rows also carry
    the columns derived at ingest (``pipeline.reads.returns``), looked up by episode and step."""
    import ray.data
    from ray.data.dataset import MaterializedDataset
    from ray.data.expressions import col

    superbatch_rows = max(minibatch_size, superbatch_rows - superbatch_rows % minibatch_size)
    options = {
        "learners": learners,
        "minibatch_size": minibatch_size,
        "seed": seed,
        "pin_memory": pin_memory,
    }
    columns, derived = split_derived(columns, gamma)
    if isinstance(source, ray.data.DataIterator):
        if derived:
            raise ValueError(
                f"columns {list(derived)} are derived from whole episodes, which one "
                "learner's shard does not hold; stream the Episodes (or use task_samples)"
            )
        if learners != 1 or materialize:
            raise ValueError(
                "a DataIterator is already one learner's shard, read as it comes: expected "
                f"num_learners=1 and no materialize=, got num_learners={learners}"
            )
        return RowSource(
            lambda epoch: iter_superbatches(source, superbatch_rows),
            columns=tuple(columns) if columns is not None else None,
            modules_to_update=check_modules(modules_to_update, None),
            exact=False,
            **options,
        )
    schema = source.schema
    chosen = resolve_columns(schema, columns)
    modules = check_modules(modules_to_update, tuple(source.module_ids))
    needed = [*chosen, *(["module_id"] if schema.has_module_id else [])]
    needed = list(dict.fromkeys([*needed, *(["eps_id", "t"] if derived else [])]))

    def selected(dataset: ray.data.Dataset) -> ray.data.Dataset:
        dataset = dataset.select_columns(needed)
        # preserve_order: the rows' order is a function of the seed alone (exact resume).
        dataset.context.execution_options.preserve_order = True
        dataset.context.target_max_block_size = _STREAM_BLOCK_BYTES
        return dataset

    epoch_tables: Callable[[int], Iterator[pa.Table]]
    reads: EpochReads | None = None
    if materialize or isinstance(source.dataset, MaterializedDataset):
        # Our own copy of the Ray context, so that the caller's dataset is left as it was
        # (``_deep_copy``, a private argument of Ray 2.60's Dataset.copy, copies the context);
        # materialized after selecting, so that an epoch runs no task per block.
        dataset = ray.data.Dataset.copy(source.dataset, _deep_copy=True).select_columns(needed)
        dataset.context.target_max_block_size = _STREAM_BLOCK_BYTES
        if modules is not None and schema.has_module_id:
            dataset = dataset.filter(expr=col("module_id").is_in(sorted(modules)))
        bundles = list(dataset.materialize().iter_internal_ref_bundles())

        def epoch_tables(epoch: int) -> Iterator[pa.Table]:
            # Blocks already sit in the object store: a seeded block order, no execution.
            for index in np.random.default_rng(seed + epoch).permutation(len(bundles)):
                yield from bundle_blocks(bundles[index])

    else:
        sizes = file_sizes(source.files, source.filesystem)
        budget = default_budget_bytes() if cache_budget_mb is None else cache_budget_mb * 2**20
        kept = FileTables(source.file_rows, int(budget), describe=str(source.root))

        def file_order(epoch: int) -> list[int]:
            return np.random.default_rng(seed + epoch).permutation(len(sizes)).tolist()

        def windows(epoch: int) -> list[Callable[[], Iterator[Any]]]:
            # A fresh read per epoch over the validated files in a seeded order, a window
            # of files at a time (see pipeline.rows.read_ahead), each window read by Ray tasks of
            # grouped files (see pipeline.rows.file_windows). Ray's randomize_block_order would
            # wait for the whole epoch to be read before handing out its first block; a
            # file order streams from the first file.
            order = file_order(epoch)
            return [
                functools.partial(
                    read_window,
                    source,
                    order[w.start : w.stop],
                    sizes,
                    needed,
                    task_bytes=_STREAM_TASK_BYTES,
                    block_bytes=_STREAM_BLOCK_BYTES,
                )
                for w in group_files([sizes[i] for i in order], _WINDOW_BYTES)
            ]

        # Once the cache is given up, one read across epochs: the next epoch's first
        # window reads while this one ends.
        reads = EpochReads(windows)

        def epoch_tables(epoch: int) -> Iterator[pa.Table]:
            if kept.complete:
                tables = kept.tables(file_order(epoch))
            elif kept.refused:
                tables = reads.tables(epoch)
            else:
                # One epoch only: read ahead into the next would be wasted once it is kept.
                tables = kept.record(file_order(epoch), read_ahead(windows(epoch)))
            if modules is not None and schema.has_module_id:
                # Filtered after the cache, which cuts tables at the files' row counts.
                tables = _only_modules(tables, modules)
            return tables

    def tables(epoch: int) -> Iterator[pa.Table]:
        return cut_tables(epoch_tables(epoch), superbatch_rows)

    if derived:
        assert gamma is not None  # split_derived refuses derived columns without it
        tables = returns_index(source, gamma).wrap(tables, derived)
    return RowSource(
        tables,
        columns=(*chosen, *derived),
        modules_to_update=modules,
        exact=True,
        close=reads.close if reads is not None else lambda: None,
        **options,
    )


def _only_modules(tables: Iterable[pa.Table], modules: frozenset[str]) -> Iterator[pa.Table]:
    """The rows of ``modules``, in order (as a filter inside Ray would keep them)."""
    wanted = pa.array(sorted(modules))
    for table in tables:
        yield table.filter(pc.is_in(table.column("module_id"), value_set=wanted))


def iter_superbatches(shard: Any, superbatch_rows: int) -> Iterator[pa.Table]:
    """Arrow super-batches of a Ray ``DataIterator`` (a Ray Train shard), batched by Ray:
    a shard gives no access to its blocks. ``prefetch_batches=1``: the stream's queues
    already keep batches ready."""
    return iter(
        shard.iter_batches(
            batch_size=superbatch_rows,
            batch_format="pyarrow",
            prefetch_batches=1,
            drop_last=False,
        )
    )


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
