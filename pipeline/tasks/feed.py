"""Where meta-batches come from: task samples in memory, or windows of tasks read in turn.

Both feeds plan an epoch as rows ``[samples, K + Q]`` (see ``TaskSamples.epoch_plan``)
and cut it the same way (``MetaBatches``): meta-batch ``j`` of learner ``r`` out of ``W``
takes samples ``[(j * W + r) * M, (j * W + r + 1) * M)``, so the learners' shares of step
``j`` are together exactly what one learner with meta-batches of ``M * W`` gets.

``TaskWindowFeed`` reads the windows of a ``TaskWindows`` one at a time, in an order
drawn from ``seed + epoch``, and deals meta-batches from *pools* that mix the samples of
two windows. With windows ``w_0 .. w_{n-1}`` in the epoch's order:

- all samples of ``w_0`` are carried to the next pool;
- pool ``p`` (``1 <= p < n - 1``) is the samples carried from ``w_{p-1}`` plus about the
  first half of ``w_p``'s (as many as make the pool whole rounds of meta-batches),
  shuffled together; the rest of ``w_p``'s are carried on;
- the last pool holds what ``w_{n-2}`` carried plus every sample of ``w_{n-1}``.

So every meta-batch holds tasks of at most two windows, the feed holds one window plus
the carried samples (at most one window's worth) at a time, and only the last pool's
samples short of a whole round are dropped (counted), as the in-memory path drops the
epoch's (unless a window has fewer samples than a round). With one window the pool is
that window's plan, unshuffled: exactly the in-memory path's meta-batches. Each window is
planned from its own seed (its index and the epoch), and every window's sample count is
known from the plan, so a resume reads only the window before the resume point (for its
carried samples) and the one it is in.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from pipeline.streams.collate import Batch, gather
from pipeline.streams.epoch_feed import Deal
from pipeline.tasks.grouping import TaskSamples
from pipeline.tasks.obs_shift import ObsShift, shift_offsets_seed
from pipeline.tasks.windows import TaskWindows

_DEAL_ROWS = 16384

Take = Callable[[np.ndarray], dict[str, torch.Tensor]]
"""Gathers rows (an index array of any shape) of every column into tensors."""


class MetaBatches:
    """Cuts an epoch's planned samples into the meta-batches of the learners ``ranks``:
    meta-batch ``j`` of learner ``r`` out of ``W`` takes samples
    ``[(j * W + r) * M, (j * W + r + 1) * M)``."""

    def __init__(
        self,
        samples: TaskSamples | TaskWindows,
        *,
        tasks_per_batch: int,
        ranks: Sequence[int],
        num_learners: int,
        shift: ObsShift | None = None,
    ) -> None:
        support, query = samples.support, samples.query
        self.shift = shift
        if shift is not None:
            if isinstance(samples, TaskSamples):
                shift.check_observations(samples.arrays["obs"].shape[1:], samples.obs_layout)
            else:
                shift.check_observations(samples.schema.obs_shape, samples.schema.obs_layout)
        self.support = support
        self.module_ids = samples.module_ids
        self.tasks = tasks_per_batch
        self.ranks = tuple(ranks)
        self.step = tasks_per_batch * num_learners
        """Samples of one round: a meta-batch for every learner."""
        self.rows_per_batch = tasks_per_batch * (support + query)
        self._per_deal = max(1, _DEAL_ROWS // (self.rows_per_batch * len(self.ranks)))

    def deals(
        self,
        take: Take,
        rows: np.ndarray,
        modules: np.ndarray,
        skip: int,
        offsets: np.ndarray | None = None,
    ) -> Iterator[Deal]:
        """Deals of the whole rounds in ``rows`` after the first ``skip``; ``take`` gathers
        the rows of every column; ``offsets``: the ``shift``'s, one row per sample of
        ``rows``."""
        steps = len(rows) // self.step
        for first in range(min(skip, steps), steps, self._per_deal):
            last = min(first + self._per_deal, steps)
            starts = [
                j * self.step + rank * self.tasks for rank in self.ranks for j in range(first, last)
            ]
            batches = self._meta_batches(take, rows, modules, np.asarray(starts), offsets)
            per_rank = last - first
            dealt = [batches[i * per_rank : (i + 1) * per_rank] for i in range(len(self.ranks))]
            yield Deal(dealt, (last - first) * self.rows_per_batch * len(self.ranks), 0)

    def end(self, dropped_rows: int) -> Deal:
        """The epoch's last deal: no batch, the rows that no learner got."""
        return Deal([[] for _ in self.ranks], 0, dropped_rows)

    def _meta_batches(
        self,
        take: Take,
        rows: np.ndarray,
        modules: np.ndarray,
        starts: np.ndarray,
        offsets: np.ndarray | None,
    ) -> list[dict[str, Batch]]:
        """The meta-batches whose samples begin at ``starts``, gathered together: one
        gather per column and part for the whole deal, then a view per meta-batch (Python
        per meta-batch, in the producer's thread, slowed the learner's beside it)."""
        samples = starts[:, None] + np.arange(self.tasks)
        picked, picked_modules = rows[samples], modules[samples]
        codes = np.arange(len(self.module_ids))
        if len(codes) > 1:
            # Each meta-batch's tasks grouped by module, in sample order within a module.
            by_module = np.argsort(picked_modules, axis=1, kind="stable")
            picked = np.take_along_axis(picked, by_module[..., None], axis=1)
            picked_modules = np.take_along_axis(picked_modules, by_module, axis=1)
            samples = np.take_along_axis(samples, by_module, axis=1)
        counts = (picked_modules[..., None] == codes).sum(axis=1)
        bounds = np.concatenate([np.zeros((len(starts), 1), int), counts.cumsum(axis=1)], axis=1)
        k = self.support
        taken = {"support": take(picked[:, :, :k]), "query": take(picked[:, :, k:])}
        if self.shift is not None:
            assert offsets is not None, "a feed with a shift deals with its offsets"
            for tensors in taken.values():
                self.shift.apply(tensors, offsets[samples])
        parts = {
            part: {name: t.unbind(0) for name, t in tensors.items()}
            for part, tensors in taken.items()
        }
        metas = []
        for i, (lows, highs) in enumerate(
            zip(bounds[:, :-1].tolist(), bounds[:, 1:].tolist(), strict=True)
        ):
            meta: dict[str, Batch] = {"support": {}, "query": {}}
            for part, tensors in parts.items():
                for module, lo, hi in zip(self.module_ids, lows, highs, strict=True):
                    if hi > lo:
                        whole = hi - lo == self.tasks
                        meta[part][module] = {
                            name: views[i] if whole else views[i][lo:hi]
                            for name, views in tensors.items()
                        }
            metas.append(meta)
        return metas


class TaskFeed:
    """Meta-batches of ``tasks_per_batch`` task samples for the learners ``ranks``."""

    exact = True

    def __init__(
        self,
        samples: TaskSamples,
        *,
        tasks_per_batch: int,
        seed: int,
        ranks: Sequence[int],
        num_learners: int,
        pin_memory: bool,
        shift: ObsShift | None = None,
    ) -> None:
        self._samples = samples
        self._seed = seed
        self._num_learners = num_learners
        self._pin_memory = pin_memory
        self._batches = MetaBatches(
            samples,
            tasks_per_batch=tasks_per_batch,
            ranks=ranks,
            num_learners=num_learners,
            shift=shift,
        )

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        rows, modules = self._samples.epoch_plan(self._seed + epoch)
        offsets = _offsets(self._batches.shift, shift_offsets_seed(self._seed, epoch), len(rows))
        yield from self._batches.deals(self._take, rows, modules, skip, offsets)
        size = self._samples.rows_per_sample
        used = len(rows) // self._batches.step * self._batches.step * size
        # Transitions no learner gets this epoch: leftover samples, task remainders.
        yield self._batches.end(int(self._samples.group_offsets[-1]) - used)

    def describe_empty(self, epoch: int, rows: int) -> str:
        samples = self._samples
        return (
            f"epoch {epoch} has {samples.samples_per_epoch} task samples of "
            f"{samples.support} support + {samples.query} query transitions, fewer than one "
            f"meta-batch of {self._batches.tasks} tasks for each of {self._num_learners} "
            "learner(s); lower minibatch_size, support or query, or add tasks"
        )

    def stats(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        """Nothing reads ahead: the samples are in memory."""

    def _take(self, index: np.ndarray) -> dict[str, torch.Tensor]:
        return _gather_all(self._samples.arrays, index, self._pin_memory)


class _Carry(NamedTuple):
    """Samples carried from one window to the next pool, gathered out of the window."""

    arrays: dict[str, np.ndarray]
    rows: np.ndarray
    """``[samples, K + Q]`` indices into ``arrays``."""
    modules: np.ndarray

    @property
    def held_rows(self) -> int:
        return self.rows.size


class _Pool(NamedTuple):
    """How one window's samples are shared out in an epoch (sizes only)."""

    window: int
    carried_out: int
    """Samples of the window left for the next pool."""
    steps: int
    """Rounds of meta-batches the pool gives."""


class TaskWindowFeed:
    """Meta-batches of ``tasks_per_batch`` task samples drawn window by window from a
    ``TaskWindows``, each mixing the tasks of at most two windows (see the module)."""

    exact = True

    def __init__(
        self,
        windows: TaskWindows,
        *,
        tasks_per_batch: int,
        seed: int,
        ranks: Sequence[int],
        num_learners: int,
        pin_memory: bool,
        shift: ObsShift | None = None,
    ) -> None:
        self._windows = windows
        self._seed = seed
        self._num_learners = num_learners
        self._pin_memory = pin_memory
        self._batches = MetaBatches(
            windows,
            tasks_per_batch=tasks_per_batch,
            ranks=ranks,
            num_learners=num_learners,
            shift=shift,
        )
        self._rows_held = self._max_rows_held = self._windows_read = 0

    def deals(self, epoch: int, skip: int) -> Iterator[Deal]:
        pools = self._pools(epoch)
        start = 0
        while start < len(pools) and skip >= pools[start].steps:
            skip -= pools[start].steps
            start += 1
        carry = None
        if 0 < start < len(pools) and pools[start - 1].carried_out:
            # Resuming inside pool ``start``: rebuild what the window before it carried.
            previous = pools[start - 1]
            window, rows, modules = self._plan(epoch, previous.window)
            fresh = len(rows) - previous.carried_out
            carry = self._carry(window, rows[fresh:], modules[fresh:])
            del window
        for position in range(start, len(pools)):
            pool = pools[position]
            window, rows, modules = self._plan(epoch, pool.window)
            self._hold(window, carry)
            fresh = len(rows) - pool.carried_out
            pool_rows, pool_modules, take = self._mix(
                epoch, position, carry, window, rows[:fresh], modules[:fresh]
            )
            offsets = _offsets(
                self._batches.shift,
                shift_offsets_seed(self._seed, epoch, position),
                len(pool_rows),
            )
            yield from self._batches.deals(take, pool_rows, pool_modules, skip, offsets)
            skip = 0
            # The carried samples are all dealt: free them before gathering the next ones.
            del take
            carry = None
            carry = self._carry(window, rows[fresh:], modules[fresh:])
            self._hold(window, carry)
            del window
            self._hold(None, carry)
        size = self._windows.rows_per_sample
        used = sum(pool.steps for pool in pools) * self._batches.step * size
        held = sum(window.held_rows for window in self._windows.windows)
        # Transitions no learner gets this epoch: task remainders, each pool's leftover.
        yield self._batches.end(held - used)

    def describe_empty(self, epoch: int, rows: int) -> str:
        windows = self._windows
        return (
            f"epoch {epoch} has {windows.samples_per_epoch} task samples of "
            f"{windows.support} support + {windows.query} query transitions in "
            f"{len(windows.windows)} windows of at most {windows.window_rows} rows, which give "
            f"fewer than one meta-batch of {self._batches.tasks} tasks for each of "
            f"{self._num_learners} learner(s) (a meta-batch mixes the tasks of at most two "
            "windows); lower minibatch_size, support or query, raise memory_budget_mb, or "
            "add tasks"
        )

    def stats(self) -> dict[str, int]:
        """Windows read and rows held (now and at most) since this feed was built."""
        return {
            "windows_read": self._windows_read,
            "rows_held": self._rows_held,
            "max_rows_held": self._max_rows_held,
        }

    def close(self) -> None:
        """Nothing reads ahead: a window is read when its pool's turn comes."""

    def _pools(self, epoch: int) -> list[_Pool]:
        count = len(self._windows.windows)
        if count == 1:
            order = [0]
        else:
            order = np.random.default_rng(self._seed_of(epoch, 2)).permutation(count).tolist()
        pools, carried = [], 0
        for position, index in enumerate(order):
            samples = self._windows.windows[index].samples
            if count == 1 or position == count - 1:
                fresh = samples
            elif position == 0:
                fresh = 0
            else:
                fresh = _whole_rounds(carried, samples, self._batches.step)
            steps = (carried + fresh) // self._batches.step
            pools.append(_Pool(index, samples - fresh, steps))
            carried = samples - fresh
        return pools

    def _plan(self, epoch: int, index: int) -> tuple[TaskSamples, np.ndarray, np.ndarray]:
        """Window ``index`` read, and its samples for ``epoch``."""
        window = self._windows.read_window(index)
        self._windows_read += 1
        # One window is the whole dataset: plan it exactly as the in-memory path does.
        single = len(self._windows.windows) == 1
        rows, modules = window.epoch_plan(
            self._seed + epoch if single else self._seed_of(epoch, 0, index)
        )
        return window, rows, modules

    def _mix(
        self,
        epoch: int,
        position: int,
        carry: _Carry | None,
        window: TaskSamples,
        rows: np.ndarray,
        modules: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, Take]:
        """The pool at ``position``: the carried samples and the window's samples
        ``rows``, shuffled together; pool rows index the carried rows, then the window's."""
        if carry is None:
            arrays = window.arrays
            return rows, modules, lambda index: _gather_all(arrays, index, self._pin_memory)
        offset = carry.held_rows
        pool_rows = np.concatenate((carry.rows, rows + offset))
        pool_modules = np.concatenate((carry.modules, modules))
        order = np.random.default_rng(self._seed_of(epoch, 1, position)).permutation(len(pool_rows))
        first, second = carry.arrays, window.arrays
        return (
            pool_rows[order],
            pool_modules[order],
            lambda index: _gather_two(first, second, index, offset, self._pin_memory),
        )

    def _carry(self, window: TaskSamples, rows: np.ndarray, modules: np.ndarray) -> _Carry | None:
        """The samples ``rows`` gathered out of ``window`` (None when there are none)."""
        if not len(rows):
            return None
        arrays = {
            name: np.take(array, rows.ravel(), axis=0) for name, array in window.arrays.items()
        }
        return _Carry(arrays, np.arange(rows.size).reshape(rows.shape), modules)

    def _hold(self, window: TaskSamples | None, carry: _Carry | None) -> None:
        window_rows = int(window.group_offsets[-1]) if window is not None else 0
        self._rows_held = window_rows + (carry.held_rows if carry is not None else 0)
        self._max_rows_held = max(self._max_rows_held, self._rows_held)

    def _seed_of(self, epoch: int, purpose: int, *keys: int) -> np.random.SeedSequence:
        return np.random.SeedSequence(self._seed + epoch, spawn_key=(purpose, *keys))


def _offsets(
    shift: ObsShift | None, seed: np.random.SeedSequence, samples: int
) -> np.ndarray | None:
    return None if shift is None else shift.offsets(seed, samples)


def _whole_rounds(carried: int, samples: int, step: int) -> int:
    """How many of a window's ``samples`` join the ``carried`` ones in a pool: about half,
    so that the pool is whole rounds of ``step`` and nothing in it is dropped; all of
    them when the window is too small for that."""
    need = -carried % step
    if need > samples:
        return samples
    half = samples // 2
    if half < need:
        return need
    return need + (half - need) // step * step


def _gather_all(
    arrays: dict[str, np.ndarray], index: np.ndarray, pin_memory: bool
) -> dict[str, torch.Tensor]:
    return {name: gather(array, index, pin_memory) for name, array in arrays.items()}


def _gather_two(
    first: dict[str, np.ndarray],
    second: dict[str, np.ndarray],
    index: np.ndarray,
    offset: int,
    pin_memory: bool,
) -> dict[str, torch.Tensor]:
    """Rows ``index`` of every column, indices below ``offset`` from ``first`` and the
    others from ``second`` (from ``offset`` on), without stacking the two."""
    in_first = index < offset
    from_first, from_second = index[in_first], index[~in_first] - offset
    tensors = {}
    for name, array in first.items():
        out = torch.empty(
            (*index.shape, *array.shape[1:]),
            dtype=torch.from_numpy(array[:0]).dtype,
            pin_memory=pin_memory,
        )
        view = out.numpy()
        view[in_first] = array[from_first]
        view[~in_first] = second[name][from_second]
        tensors[name] = out
    return tensors
