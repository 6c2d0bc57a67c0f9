"""The blocks of Ray Data executions, drained one window ahead of their consumer.

Ray Data 2.60's streaming executor runs a scheduling loop in a driver thread until every
output of an execution has been taken. While outputs wait for a slower consumer, or read
tasks wait on a read-ahead budget, the loop finds nothing to wait on and spins: measured
here, ~1,400 loop steps and 0.7 s of driver CPU for one 5M-row epoch, taken from the two
cores that the read tasks and the learners need (Ray issue #65060 reports the same spin).

So a stream never lets an execution wait for it. An epoch is cut into *windows* (a few
files each); one helper thread runs the windows' executions one after another and takes
each bundle (object references, not data) the moment it exists, so that every execution
ends as soon as its reads do. The helper starts window ``k`` only once the consumer has
finished window ``k - 2``, so at most two windows sit in the object store at any time,
whatever the dataset's size.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import ray.data

_JOIN_S = 5.0


@dataclass(frozen=True)
class _Window:
    index: int


@dataclass(frozen=True)
class _Failure:
    error: BaseException


_DONE = object()


def read_ahead(
    windows: Sequence[Callable[[], ray.data.Dataset]], *, name: str = "offmeta-read-ahead"
) -> Iterator[pa.Table]:
    """The blocks of every window's Dataset as Arrow tables, window after window, in
    each Dataset's order. ``windows`` builds each Dataset when its turn comes.

    A failed execution raises here, in the consumer. Closing the generator stops the
    helper thread at its next bundle.
    """
    handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()
    finished = threading.Semaphore(0)  # one release per window the consumer has finished
    stop = threading.Event()

    def fetch() -> None:
        try:
            for index, build in enumerate(windows):
                # Window k waits until the consumer is done with window k - 2.
                while index >= 2 and not finished.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                handoff.put(_Window(index))
                for bundle in build().iter_internal_ref_bundles():
                    handoff.put(bundle)
                    if stop.is_set():
                        return
            handoff.put(_DONE)
        except BaseException as error:  # relayed to the consumer, which re-raises it
            handoff.put(_Failure(error))

    thread = threading.Thread(target=fetch, name=name, daemon=True)
    thread.start()
    try:
        while (item := handoff.get()) is not _DONE:
            if isinstance(item, _Failure):
                raise item.error
            if isinstance(item, _Window):
                if item.index:
                    finished.release()
                continue
            yield from bundle_blocks(item)
    finally:
        stop.set()
        thread.join(timeout=_JOIN_S)


def bundle_blocks(bundle: Any) -> Iterator[pa.Table]:
    """The blocks of one Ray ``RefBundle`` (from ``Dataset.iter_internal_ref_bundles``, a
    public DeveloperAPI) as Arrow tables; a bundle may hold a row range of a block (after
    a ``limit``, say), which is honoured."""
    import ray

    refs = bundle.block_refs
    slices = getattr(bundle, "slices", None) or (None,) * len(refs)
    for ref, piece in zip(refs, slices, strict=True):
        block = ray.get(ref)
        if not isinstance(block, pa.Table):
            block = pa.Table.from_pandas(block, preserve_index=False)
        if piece is not None:
            block = block.slice(piece.start_offset, piece.end_offset - piece.start_offset)
        yield block


def file_windows(files: Sequence[str], sizes: Sequence[int], window_bytes: int) -> list[list[str]]:
    """``files`` in order, cut into runs of at most ``window_bytes`` on disk (a larger
    file is a window of its own)."""
    windows: list[list[str]] = []
    total = 0
    for path, size in zip(files, sizes, strict=True):
        if not windows or total + size > window_bytes:
            windows.append([])
            total = 0
        windows[-1].append(path)
        total += size
    return windows
