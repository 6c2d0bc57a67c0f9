"""The blocks of windows of reads (Ray Data executions, or plain Ray tasks), drained one
window ahead of their consumer.

Ray Data 2.60's streaming executor runs a scheduling loop in a driver thread until every
output of an execution has been taken. While outputs wait for a slower consumer, or read
tasks wait on a read-ahead budget, the loop finds nothing to wait on and spins: measured
here, ~1,400 loop steps and 0.7 s of driver CPU for one 5M-row epoch, taken from the two
cores that the read tasks and the learners need (Ray issue #65060 reports the same spin).

So a stream never lets an execution wait for it. An epoch is cut into *windows* (a few
files each), each read by an execution (or tasks, see ``pipeline.rows.file_windows``) of its
own; a helper thread per window takes its bundles (object references, not data) the
moment they exist, so that every execution ends as soon as its reads do. Window ``k``
starts only once the consumer has finished window ``k - 2``, so at most two windows sit
in the object store at any time, whatever the dataset's size.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from pipeline.contract.schema import DatasetError

_JOIN_S = 5.0

Window = Any
"""What a window's builder returns: a Ray ``Dataset``, or an iterable of block references
(``ray.ObjectRef``, as ``pipeline.rows.file_windows`` gives them), taken in order."""


@dataclass(frozen=True)
class _Failure:
    error: BaseException


_DONE = object()


def read_ahead(
    windows: Iterable[Callable[[], Window]], *, name: str = "offmeta-read-ahead"
) -> Iterator[pa.Table]:
    """The blocks of every window (a Dataset, or block references) as Arrow tables, window
    after window, each in its own order. ``windows`` builds each Dataset when its turn comes; it is
    iterated lazily (by a helper thread), so it may be endless.

    Two windows read at once: while the consumer is on window ``k``, window ``k + 1``
    reads, so read tasks never wait for the last file of a window. A thread per window
    drains it; window ``k + 2`` starts once the consumer has finished window ``k``. A
    failed execution raises here, in the consumer. Closing the generator stops the
    helper threads at their next bundle.
    """
    with contextlib.closing(read_windows(windows, name=name)) as blocks:
        for block in blocks:
            if block is not None:
                yield block


def read_windows(
    windows: Iterable[Callable[[], Window]], *, name: str = "offmeta-read-ahead"
) -> Iterator[pa.Table | None]:
    """``read_ahead``, with a ``None`` after the last block of each window."""
    handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()  # a bundle queue per window
    finished = threading.Semaphore(0)  # one release per window the consumer has finished
    stop = threading.Event()
    drains: list[threading.Thread] = []

    def drain(build: Callable[[], Window], bundles: queue.SimpleQueue[Any]) -> None:
        try:
            for bundle in _bundles(build()):
                bundles.put(bundle)
                if stop.is_set():
                    return
            bundles.put(_DONE)
        except BaseException as error:  # relayed to the consumer, which re-raises it
            bundles.put(_Failure(error))

    def launch() -> None:
        try:
            for index, build in enumerate(windows):
                while index >= 2 and not finished.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                bundles: queue.SimpleQueue[Any] = queue.SimpleQueue()
                thread = threading.Thread(
                    target=drain, args=(build, bundles), name=f"{name}-{index}", daemon=True
                )
                drains.append(thread)
                thread.start()
                handoff.put(bundles)
            handoff.put(_DONE)
        except BaseException as error:  # a failure to list the windows, relayed likewise
            handoff.put(_Failure(error))

    launcher = threading.Thread(target=launch, name=name, daemon=True)
    launcher.start()
    try:
        while (bundles := handoff.get()) is not _DONE:
            if isinstance(bundles, _Failure):
                raise bundles.error
            while (item := bundles.get()) is not _DONE:
                if isinstance(item, _Failure):
                    raise item.error
                yield from bundle_blocks(item)
            finished.release()
            yield None
    finally:
        stop.set()
        launcher.join(timeout=_JOIN_S)
        for thread in list(drains):
            thread.join(timeout=_JOIN_S)


class EpochReads:
    """The blocks of epoch after epoch, read as one ``read_windows``: while the consumer
    takes the last window of epoch ``e``, the first window of epoch ``e + 1`` already
    reads, so starting an epoch costs no more than one window's latency, and at most two
    windows are held, across the boundary too.

    ``windows_of(epoch)`` lists an epoch's windows (at least one); it is called for epoch
    ``e + 1`` while epoch ``e`` is read, so it must depend on ``epoch`` alone. One consumer
    thread calls ``tables`` and ``close``.
    """

    def __init__(
        self,
        windows_of: Callable[[int], Sequence[Callable[[], Window]]],
        *,
        name: str = "offmeta-read-ahead",
    ) -> None:
        self._windows_of = windows_of
        self._name = name
        self._blocks: Iterator[pa.Table | None] | None = None
        self._counts: dict[int, int] = {}
        self._next_epoch: int | None = None  # the epoch the running read stands at the start of

    def tables(self, epoch: int) -> Iterator[pa.Table]:
        """The blocks of ``epoch``, in order. Continues the running read when the last
        epoch was read to its end and ``epoch`` follows it; otherwise (the first epoch, a
        resume, an epoch left unfinished) starts a new read at ``epoch``."""
        if self._blocks is None or self._next_epoch != epoch:
            self.close()
            self._counts = {}
            self._blocks = read_windows(self._epochs(epoch, self._counts), name=self._name)
        self._next_epoch = None
        return self._epoch(epoch, self._blocks, self._counts)

    def close(self) -> None:
        """Stop the running read and its threads. Idempotent."""
        blocks, self._blocks, self._next_epoch = self._blocks, None, None
        if blocks is not None:
            blocks.close()

    def _epochs(self, first: int, counts: dict[int, int]) -> Iterator[Callable[[], Any]]:
        for epoch in itertools.count(first):
            windows = list(self._windows_of(epoch))
            if not windows:
                raise ValueError(f"epoch {epoch} has no window to read: expected at least one")
            # Set before the epoch's first window is handed over, so before the consumer
            # can see any of its window ends.
            counts[epoch] = len(windows)
            yield from windows

    def _epoch(
        self, epoch: int, blocks: Iterator[pa.Table | None], counts: dict[int, int]
    ) -> Iterator[pa.Table]:
        ends = 0
        try:
            for block in blocks:
                if block is not None:
                    yield block
                    continue
                ends += 1
                if ends == counts[epoch]:
                    break
        finally:
            if ends == counts.get(epoch) and self._blocks is blocks:
                self._next_epoch = epoch + 1
            elif self._blocks is blocks:
                # Left mid-epoch: the read's position is lost, and its windows would sit
                # in the object store until the next epoch.
                self.close()


def _bundles(window: Window) -> Iterable[Any]:
    """What a window gives: a Dataset's bundles as its execution makes them, or the block
    references it is."""
    import ray.data

    from pipeline.ray_compat import ref_bundles

    return ref_bundles(window) if isinstance(window, ray.data.Dataset) else window


def bundle_blocks(bundle: Any) -> Iterator[pa.Table]:
    """The blocks of one Ray ``RefBundle`` (``pipeline.ray_compat.ref_bundles``) as Arrow
    tables, row ranges honoured; a plain object reference is one block."""
    import ray

    from pipeline.ray_compat import bundle_tables

    if isinstance(bundle, ray.ObjectRef):
        try:
            block = ray.get(bundle)
        except ray.exceptions.RayTaskError as error:
            # A read task refused the data (a file changed or broken since validation, a
            # NaN it found): the refusal is the message, not the task's traceback.
            if isinstance(error.cause, DatasetError):
                raise error.cause from None
            raise
        yield block
        return
    yield from bundle_tables(bundle)
