"""Reading meta-batches ahead of the learner, in a thread, never past a given count.

`Prefetcher(iterator, depth, limit)` pulls items from `iterator` in a daemon thread, at most
`depth` ahead of the consumer and never more than `limit` in total; `allow(limit)` raises the
bound. The training loop bounds it by the next checkpoint: when a checkpoint is taken, exactly
the meta-batches stepped have been read, so a stream's position saved with it is exact. What
the thread runs (a stream's `take`: waiting for its producer, the copy to the device) then
overlaps the learner's step.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_POLL_S = 0.1
_JOIN_S = 10.0


class Prefetcher(Generic[T]):
    """An iterator over `iterator`'s items, read ahead by a thread (see the module doc).

    Errors raised by `iterator` are raised by `__next__` in the consumer. Call `close()`
    when done (it stops the thread; the iterator is left where the thread stopped).
    """

    def __init__(self, iterator: Iterator[T], *, depth: int, limit: int) -> None:
        if depth < 1 or limit < 0:
            raise ValueError(f"depth must be >= 1 and limit >= 0, got {depth} and {limit}")
        self._iterator = iterator
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
        self._allowed = threading.Condition()
        self._limit = limit
        self._read = 0
        self._stopped = False
        self._done = False
        self._thread = threading.Thread(target=self._run, name="offmeta-prefetch", daemon=True)
        self._thread.start()

    def allow(self, limit: int) -> None:
        """Let the thread read up to `limit` items in total (a bound never goes down)."""
        with self._allowed:
            self._limit = max(self._limit, limit)
            self._allowed.notify()

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "item":
            return value
        self._done = True
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Stop the thread, waiting up to 10 s for an item it is still reading. Idempotent."""
        with self._allowed:
            self._stopped = True
            self._allowed.notify()
        # A thread waiting on a full queue sees the stop within one poll.
        _drain(self._queue)
        self._thread.join(timeout=_JOIN_S)
        self._done = True

    def _run(self) -> None:
        try:
            while True:
                with self._allowed:
                    while self._read >= self._limit and not self._stopped:
                        self._allowed.wait()
                    if self._stopped:
                        return
                try:
                    item = next(self._iterator)
                except StopIteration:
                    self._put(("end", None))
                    return
                self._read += 1
                if not self._put(("item", item)):
                    return
        except BaseException as error:  # relayed to the consumer, which raises it
            self._put(("error", error))

    def _put(self, message: tuple[str, Any]) -> bool:
        while not self._stopped:
            try:
                self._queue.put(message, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False


def _drain(pending: queue.Queue) -> None:
    while True:
        try:
            pending.get_nowait()
        except queue.Empty:
            return
