"""The blocks of Ray Data executions, drained one window ahead of their consumer.

Ray Data 2.60's streaming executor runs a scheduling loop in a driver thread until every
output of an execution has been taken. While outputs wait for a slower consumer, or read
tasks wait on a read-ahead budget, the loop finds nothing to wait on and spins: measured
here, ~1,400 loop steps and 0.7 s of driver CPU for one 5M-row epoch, taken from the two
cores that the read tasks and the learners need (Ray issue #65060 reports the same spin).

So a stream never lets an execution wait for it. An epoch is cut into *windows* (a few
files each), each read by an execution of its own; a helper thread per window takes its
bundles (object references, not data) the moment they exist, so that every execution
ends as soon as its reads do. Window ``k`` starts only once the consumer has finished
window ``k - 2``, so at most two windows sit in the object store at any time, whatever
the dataset's size.
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
class _Failure:
    error: BaseException


_DONE = object()


def read_ahead(
    windows: Sequence[Callable[[], ray.data.Dataset]], *, name: str = "offmeta-read-ahead"
) -> Iterator[pa.Table]:
    """The blocks of every window's Dataset as Arrow tables, window after window, in
    each Dataset's order. ``windows`` builds each Dataset when its turn comes.

    Two windows read at once: while the consumer is on window ``k``, window ``k + 1``
    reads, so read tasks never wait for the last file of a window. A thread per window
    drains it; window ``k + 2`` starts once the consumer has finished window ``k``. A
    failed execution raises here, in the consumer. Closing the generator stops the
    helper threads at their next bundle.
    """
    handoff: queue.SimpleQueue[Any] = queue.SimpleQueue()  # a bundle queue per window
    finished = threading.Semaphore(0)  # one release per window the consumer has finished
    stop = threading.Event()
    drains: list[threading.Thread] = []

    def drain(build: Callable[[], ray.data.Dataset], bundles: queue.SimpleQueue[Any]) -> None:
        try:
            for bundle in build().iter_internal_ref_bundles():
                bundles.put(bundle)
                if stop.is_set():
                    return
            bundles.put(_DONE)
        except BaseException as error:  # relayed to the consumer, which re-raises it
            bundles.put(_Failure(error))

    def launch() -> None:
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

    launcher = threading.Thread(target=launch, name=name, daemon=True)
    launcher.start()
    try:
        while (bundles := handoff.get()) is not _DONE:
            while (item := bundles.get()) is not _DONE:
                if isinstance(item, _Failure):
                    raise item.error
                yield from bundle_blocks(item)
            finished.release()
    finally:
        stop.set()
        launcher.join(timeout=_JOIN_S)
        for thread in list(drains):
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
