"""Where a row stream's epochs of Arrow tables come from, one class per kind of read.

``FileEpochs`` reads the dataset's files, a window of files at a time, in an order drawn
from ``seed + epoch``, and serves later epochs from the first one when it fits the cache
budget (``pipeline.rows.epoch_cache``). ``BlockEpochs`` holds the selected columns
materialised in Ray's object store and chains their blocks in a seeded order.
``shard_superbatches`` batches a Ray Train shard, which gives no access to its blocks.
The row feed (``pipeline.rows.feed``) re-cuts the tables into super-batches.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.value_checks import check_read_values
from pipeline.io.parquet_files import file_sizes, group_files
from pipeline.reads.episodes import Episodes
from pipeline.rows.epoch_cache import FileTables, default_budget_bytes
from pipeline.rows.file_windows import read_window
from pipeline.rows.read_ahead import EpochReads, bundle_blocks, read_ahead

# The driver maps every block it reads, so its memory follows the blocks in flight: small
# blocks and windows of files read one ahead keep a streamed epoch flat (Ray's defaults,
# 128 MiB blocks and a budget of a fraction of the object store, let it grow with the
# dataset). A window is cut by size on disk and read by tasks of at most 16 MiB of files (or
# 1,024 small files, see pipeline.reads.file_groups): larger tasks run further ahead of the
# consumer, and with 64 MiB tasks the driver's peak RSS streaming 2M rows from 16 MB files
# was 5% higher (2-core machine).
STREAM_BLOCK_BYTES = 16 << 20
_WINDOW_BYTES = 128 << 20
_STREAM_TASK_BYTES = 16 << 20


class BlockEpochs:
    """The ``columns`` of ``episodes`` (rows of ``modules`` only, when given), read once
    into Ray's object store; epoch ``e`` chains its blocks in an order drawn from
    ``seed + e``, running no task. When validation did not scan every row's values, the
    blocks are checked for NaN and inf once, as they are read
    (``pipeline.contract.value_checks.check_read_values``)."""

    def __init__(
        self,
        episodes: Episodes,
        columns: Sequence[str],
        modules: frozenset[str] | None,
        *,
        seed: int,
    ) -> None:
        from ray.data.expressions import col

        from pipeline.ray_compat import isolated_copy, ref_bundles

        # A copy with its own context leaves the caller's dataset as it was; materialized
        # after selecting, so that an epoch runs no task per block.
        dataset = isolated_copy(episodes.dataset).select_columns(list(columns))
        dataset.context.target_max_block_size = STREAM_BLOCK_BYTES
        if modules is not None and episodes.schema.has_module_id:
            dataset = dataset.filter(expr=col("module_id").is_in(sorted(modules)))
        self._bundles = list(ref_bundles(dataset.materialize()))
        self._seed = seed
        values = episodes.values
        if not values.every_row:
            for bundle in self._bundles:
                for table in bundle_blocks(bundle):
                    check_read_values(
                        table, episodes.files, episodes.filesystem, episodes.schema, values
                    )

    def tables(self, epoch: int) -> Iterator[pa.Table]:
        order = np.random.default_rng(self._seed + epoch).permutation(len(self._bundles))
        for index in order:
            yield from bundle_blocks(self._bundles[index])

    def close(self) -> None:
        """Nothing reads ahead: the blocks are in the object store."""


class FileEpochs:
    """The ``columns`` of ``episodes``' files (rows of ``modules`` only, when given), epoch
    ``e`` reading the files in an order drawn from ``seed + e``.

    The first epoch read to its end is kept when it fits ``cache_budget_mb`` MiB (None: a
    quarter of Ray's object store); once the cache is given up, one read runs across
    epochs, the next epoch's first window reading while this one ends (``close`` stops it).
    """

    def __init__(
        self,
        episodes: Episodes,
        columns: Sequence[str],
        modules: frozenset[str] | None,
        *,
        seed: int,
        cache_budget_mb: float | None,
    ) -> None:
        self._episodes = episodes
        self._columns = list(columns)
        self._modules = modules if episodes.schema.has_module_id else None
        self._seed = seed
        self._sizes = file_sizes(episodes.files, episodes.filesystem)
        budget = default_budget_bytes() if cache_budget_mb is None else cache_budget_mb * 2**20
        self._kept = FileTables(episodes.file_rows, int(budget), describe=str(episodes.root))
        self._reads = EpochReads(self._windows)

    def tables(self, epoch: int) -> Iterator[pa.Table]:
        kept = self._kept
        if kept.complete:
            tables = kept.tables(self._file_order(epoch))
        elif kept.refused:
            tables = self._reads.tables(epoch)
        else:
            # One epoch only: read ahead into the next would be wasted once it is kept.
            tables = kept.record(self._file_order(epoch), read_ahead(self._windows(epoch)))
        if self._modules is not None:
            # Filtered after the cache, which cuts tables at the files' row counts.
            tables = _only_modules(tables, self._modules)
        return tables

    def close(self) -> None:
        """Stop reading ahead (the next epoch's first window may be reading)."""
        self._reads.close()

    def _file_order(self, epoch: int) -> list[int]:
        return np.random.default_rng(self._seed + epoch).permutation(len(self._sizes)).tolist()

    def _windows(self, epoch: int) -> list[Callable[[], Iterator[Any]]]:
        # A fresh read per epoch over the validated files in a seeded order, a window of
        # files at a time (see pipeline.rows.read_ahead), each window read by Ray tasks of
        # grouped files (see pipeline.rows.file_windows). Ray's randomize_block_order would
        # wait for the whole epoch to be read before handing out its first block; a file
        # order streams from the first file.
        order, sizes = self._file_order(epoch), self._sizes
        return [
            functools.partial(
                read_window,
                self._episodes,
                order[w.start : w.stop],
                sizes,
                self._columns,
                task_bytes=_STREAM_TASK_BYTES,
                block_bytes=STREAM_BLOCK_BYTES,
            )
            for w in group_files([sizes[i] for i in order], _WINDOW_BYTES)
        ]


def shard_superbatches(shard: Any, superbatch_rows: int) -> Iterator[pa.Table]:
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


def _only_modules(tables: Iterable[pa.Table], modules: frozenset[str]) -> Iterator[pa.Table]:
    """The rows of ``modules``, in order (as a filter inside Ray would keep them)."""
    wanted = pa.array(sorted(modules))
    for table in tables:
        yield table.filter(pc.is_in(table.column("module_id"), value_set=wanted))
