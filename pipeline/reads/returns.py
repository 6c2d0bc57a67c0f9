"""Discounted return-to-go per episode, derived at ingest: the ``returns`` column.

``returns[t] = sum_k gamma^k * rewards[t + k]`` over the rest of the row's episode, in
float64 and stored as float32. Computed for every row at once, never row by row in Python:
a doubling scan over rows sorted by (episode, t) takes ``ceil(log2(longest episode))`` numpy
passes, each adding the sum of the next ``2^j`` rewards, and never mixes in rows of
another episode.

Truncated episodes: without a critic nothing can stand in for the rewards after the last
recorded step, so the return covers the recorded part only (no bootstrap), and
``returns_truncated`` is True on every row of an episode whose last recorded step is not
``terminateds`` (truncated, or the recording stopped): there the return underestimates (or
overestimates) what the policy would have collected. A learner with a critic can bootstrap
those rows itself from ``new_obs``.

Task samples compute the columns from the rows they already hold in (episode, t) order; row
streams, whose rows arrive shuffled in super-batches, look each row up by ``(eps_id, t)``
(``(module_id, eps_id, t)`` when there is a ``module_id`` column: agents of one recording
share episode ids) in a ``ReturnsIndex`` built once from the id, reward and flag columns of
the whole dataset (an episode may span files).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.returns_to_go import RETURNS_COLUMN, check_gamma, discounted_returns
from pipeline.contract.schema import DatasetError
from pipeline.io.arrow_columns import decoded

if TYPE_CHECKING:
    from pipeline.reads.episodes import Episodes

RETURNS = RETURNS_COLUMN
RETURNS_TRUNCATED = "returns_truncated"
DERIVED_COLUMNS = (RETURNS, RETURNS_TRUNCATED)
"""Columns derived at ingest when a discount ``gamma`` is given."""
INPUT_COLUMNS = ("eps_id", "t", "rewards", "terminateds")
"""What the derivation reads."""


def split_derived(
    columns: Sequence[str] | None, gamma: float | None
) -> tuple[Sequence[str] | None, tuple[str, ...]]:
    """``(stored columns, derived columns)`` for a request of ``columns`` (None: the
    defaults): with ``gamma`` every derived column comes along unless ``columns`` names
    which; naming one without ``gamma`` is refused."""
    check_gamma(gamma)
    if columns is None or isinstance(columns, str):
        return columns, DERIVED_COLUMNS if gamma is not None else ()
    derived = tuple(name for name in columns if name in DERIVED_COLUMNS)
    if derived and gamma is None:
        raise ValueError(
            f"columns {list(derived)} are derived at ingest with a discount: pass gamma= "
            "(data.gamma in a run config)"
        )
    stored = [name for name in columns if name not in DERIVED_COLUMNS]
    return stored, derived


def returns_columns(table: pa.Table, gamma: float) -> dict[str, np.ndarray]:
    """``returns`` (float32) and ``returns_truncated`` (bool) of a table whose episodes are
    contiguous, each in step order. With a ``module_id`` column an episode is
    ``(module_id, eps_id)``: agents of one recording may share ``eps_id``."""
    n = table.num_rows
    if n == 0:
        return {RETURNS: np.zeros(0, np.float32), RETURNS_TRUNCATED: np.zeros(0, bool)}
    keys = [name for name in ("module_id", "eps_id") if name in table.column_names]
    changed = None
    for name in keys:
        values = decoded(table.column(name))
        step = pc.not_equal(values.slice(1), values.slice(0, n - 1))
        changed = step if changed is None else pc.or_(changed, step)
    starts = np.concatenate(([0], np.flatnonzero(_numpy_bool(changed)) + 1))
    rewards = table.column("rewards").to_numpy()
    last = np.append(starts[1:], n) - 1
    terminated = _numpy_bool(table.column("terminateds"))[last]
    lengths = np.diff(np.append(starts, n))
    return {
        RETURNS: discounted_returns(rewards, starts, gamma).astype(np.float32),
        RETURNS_TRUNCATED: np.repeat(~terminated, lengths),
    }


class ReturnsIndex:
    """The derived columns of every row of a dataset, found by ``(eps_id, t)``, or by
    ``(module_id, eps_id, t)`` when the dataset has a ``module_id`` column."""

    def __init__(self, table: pa.Table, gamma: float) -> None:
        """``table``: the ``INPUT_COLUMNS`` of every row (and ``module_id`` if the dataset
        has one), in any order."""
        episodes = decoded(table.column("eps_id")).combine_chunks()
        self._names = None if pa.types.is_integer(episodes.type) else pc.unique(episodes)
        self._modules = (
            pc.unique(decoded(table.column("module_id")).combine_chunks())
            if "module_id" in table.column_names
            else None
        )
        codes = self._codes(episodes)
        self._c0 = int(codes.min()) if len(codes) else 0
        self._c_span = int(codes.max()) - self._c0 + 1 if len(codes) else 1
        t = table.column("t").to_numpy().astype(np.int64)
        self._t0 = int(t.min()) if len(t) else 0
        self._span = int(t.max()) - self._t0 + 1 if len(t) else 1
        modules = 1 if self._modules is None else max(len(self._modules), 1)
        if len(codes) and modules * self._c_span * self._span >= 2**62:
            raise DatasetError(
                f"returns: {len(codes)} rows with episode ids up to {int(codes.max())}, up "
                f"to {self._span} steps and {modules} modules do not fit one int64 key; store "
                "compact episode ids"
            )
        keys, _ = self._keys(table, codes, t)
        order = np.argsort(keys, kind="stable")
        self._keys_sorted = keys[order]
        repeated = np.flatnonzero(np.diff(self._keys_sorted) == 0)
        if len(repeated):
            row = int(order[repeated[0]])
            raise DatasetError(
                f"returns: {self._where(table, row)} is on more than one row; expected each "
                "step of an episode once (offmeta data validate names every repeated row)"
            )
        self._values = returns_columns(table.take(pa.array(order)), gamma)

    def add_to(self, table: pa.Table, columns: Sequence[str]) -> pa.Table:
        """``table`` (with ``eps_id``, ``t`` and, in a dataset with modules, ``module_id``)
        plus the derived ``columns`` of its rows."""
        codes = self._codes(decoded(table.column("eps_id")).combine_chunks())
        t = table.column("t").to_numpy().astype(np.int64)
        keys, known = self._keys(table, codes, t)
        where = np.searchsorted(self._keys_sorted, keys)
        # Ids or steps outside the dataset's ranges would alias another episode's key.
        found = known & (where < len(self._keys_sorted))
        found[found] = self._keys_sorted[where[found]] == keys[found]
        if not found.all():
            row = int(np.flatnonzero(~found)[0])
            raise DatasetError(
                f"returns: {self._where(table, row)} is not in the dataset the returns were "
                "derived from; expected the rows of the dataset as read (read it again after "
                "changing its files)"
            )
        for name in columns:
            table = table.append_column(name, pa.array(self._values[name][where]))
        return table

    def wrap(
        self, epoch_tables: Callable[[int], Iterator[pa.Table]], columns: Sequence[str]
    ) -> Callable[[int], Iterator[pa.Table]]:
        """``epoch_tables`` with the derived ``columns`` added to every table it yields."""

        def tables(epoch: int) -> Iterator[pa.Table]:
            inner = epoch_tables(epoch)
            try:
                for table in inner:
                    yield self.add_to(table, columns)
            finally:
                close = getattr(inner, "close", None)
                if close is not None:
                    close()

        return tables

    def _codes(self, episodes: pa.Array) -> np.ndarray:
        if self._names is None:
            return episodes.to_numpy(zero_copy_only=False).astype(np.int64)
        codes = pc.index_in(episodes, value_set=self._names)
        # A missing id becomes -1 here and fails the range check in _keys.
        return pc.fill_null(codes, -1).to_numpy().astype(np.int64)

    def _keys(self, table: pa.Table, codes: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
        """One int64 key per row, and whether the row's ids and step are in range (a key
        out of range may equal another row's)."""
        episode, step = codes - self._c0, t - self._t0
        known = (episode >= 0) & (episode < self._c_span) & (step >= 0) & (step < self._span)
        if self._modules is not None:
            modules = pc.index_in(
                decoded(table.column("module_id")).combine_chunks(), value_set=self._modules
            )
            module = pc.fill_null(modules, -1).to_numpy().astype(np.int64)
            known &= module >= 0
            episode = module * self._c_span + episode
        return episode * self._span + step, known

    def _where(self, table: pa.Table, row: int) -> str:
        names = ["eps_id", "t"] if self._modules is None else ["module_id", "eps_id", "t"]
        return " ".join(f"{name} {table.column(name)[row].as_py()!r}" for name in names)


def returns_index(episodes: Episodes, gamma: float) -> ReturnsIndex:
    """A ``ReturnsIndex`` of every row of ``episodes``, read through its Ray Dataset (the
    input columns only)."""
    check_gamma(gamma)
    modules = ["module_id"] if episodes.schema.has_module_id else []
    dataset = episodes.dataset.select_columns([*modules, *INPUT_COLUMNS])
    parts = list(dataset.iter_batches(batch_size=None, batch_format="pyarrow"))
    return ReturnsIndex(pa.concat_tables(parts), gamma)


def _numpy_bool(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)
