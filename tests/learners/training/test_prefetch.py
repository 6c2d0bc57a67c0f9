"""Reading meta-batches ahead (`learners.training.prefetch`): bounded by depth and by a limit the
loop raises after each checkpoint, errors relayed to the consumer, a stop that does not hang; and
the training loop with prefetch reading exactly the stepped meta-batches at every checkpoint
and ending where the loop without prefetch ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import torch

from learners import MetaLearner, run_meta_training
from learners.training.prefetch import Prefetcher

_TIMEOUT_S = 10.0


class _Counting:
    """An iterator over `items` that counts how many were drawn from it (thread-safe)."""

    def __init__(self, items: list, *, fail_at: int | None = None) -> None:
        self._items = items
        self._fail_at = fail_at
        self.drawn = 0
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator:
        return self

    def __next__(self):
        with self._lock:
            if self.drawn == self._fail_at:
                raise RuntimeError(f"item {self.drawn} is broken")
            if self.drawn >= len(self._items):
                raise StopIteration
            self.drawn += 1
            return self._items[self.drawn - 1]


def _settle(condition, what: str) -> None:
    deadline = time.monotonic() + _TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_reads_ahead_by_depth_and_never_past_the_limit() -> None:
    source = _Counting(list(range(10)))
    prefetcher = Prefetcher(source, depth=2, limit=4)
    try:
        # The queue holds 2 and the thread holds a third, waiting for room.
        _settle(lambda: source.drawn == 3, "3 items read ahead")
        time.sleep(0.2)
        assert source.drawn == 3
        assert [next(prefetcher) for _ in range(4)] == [0, 1, 2, 3]
        time.sleep(0.2)
        assert source.drawn == 4  # the limit holds although the queue has room
        prefetcher.allow(6)
        assert [next(prefetcher) for _ in range(2)] == [4, 5]
        prefetcher.allow(20)
        assert list(prefetcher) == [6, 7, 8, 9]
    finally:
        prefetcher.close()


def test_errors_reach_the_consumer_after_the_items_before_them() -> None:
    prefetcher = Prefetcher(_Counting(list(range(5)), fail_at=2), depth=3, limit=5)
    try:
        assert [next(prefetcher), next(prefetcher)] == [0, 1]
        with pytest.raises(RuntimeError, match="item 2 is broken"):
            next(prefetcher)
        with pytest.raises(StopIteration):
            next(prefetcher)
    finally:
        prefetcher.close()


def test_close_stops_a_thread_waiting_for_room_or_for_the_limit() -> None:
    for limit in (1, 100):
        prefetcher = Prefetcher(_Counting(list(range(100))), depth=1, limit=limit)
        thread = prefetcher._thread
        time.sleep(0.1)
        started = time.monotonic()
        prefetcher.close()
        assert not thread.is_alive()
        assert time.monotonic() - started < _TIMEOUT_S
        with pytest.raises(StopIteration):
            next(prefetcher)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="depth must be >= 1 and limit >= 0, got 0 and 3"):
        Prefetcher(iter([]), depth=0, limit=3)


CONFIG = {"modules": {"m": {"obs_dim": 1, "action_dim": 1, "model": {"hidden_sizes": [8]}}}}


def _meta_batches(count: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)

    def part() -> dict:
        obs = torch.randn(3, 4, 1, generator=g)
        return {"m": {"obs": obs, "actions": torch.sin(obs)}}

    return [{"support": part(), "query": part()} for _ in range(count)]


def test_the_loop_with_prefetch_reads_exactly_the_stepped_meta_batches_at_each_checkpoint():
    batches = _meta_batches(11)
    settings = {"start": 1, "stop": 11, "log_every": 3, "checkpoint_every": 4}
    plain = MetaLearner(CONFIG)
    plain_history = run_meta_training(plain, batches[1:], **settings)

    source = _Counting(batches[1:])
    learner = MetaLearner(CONFIG)
    drawn_at_checkpoints = {}

    def checkpoint(iteration: int, history: dict) -> None:
        time.sleep(0.1)  # room for a thread that would read past the checkpoint
        drawn_at_checkpoints[iteration] = source.drawn

    history = run_meta_training(learner, source, on_checkpoint=checkpoint, prefetch=3, **settings)
    assert drawn_at_checkpoints == {4: 3, 8: 7, 11: 10}
    assert history == plain_history
    for name, p in plain.meta_params["m"].items():
        assert torch.equal(learner.meta_params["m"][name], p)
    with pytest.raises(ValueError, match="prefetch must be >= 0, got -1"):
        run_meta_training(learner, batches, prefetch=-1, **settings)
