"""Number the steps of RLlib recorder rows per episode, in recording order.

RLlib's recorder writes no step index. Rows of one episode within one write (one
``run-*`` directory, one ``sample()`` call) are consecutive steps in file order. A later
write holding the same episode either repeats it from its first step (the recorder never
empties its buffer) or continues it (the episode was cut at a sample boundary). The two are
told apart by observations: a repeat starts with step 0's ``obs``, a continuation with the
last known step's ``new_obs``. A write whose first row does neither is refused.

State: one small ``_Cursor`` per episode; rows are numbered in vectorised segments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.contract.schema import DatasetError


@dataclass
class _Cursor:
    steps: int
    """Steps known so far."""
    first_obs: int
    """Hash of step 0's ``obs``."""
    last_new_obs: int | None
    """Hash of the last known step's ``new_obs``; None without that column."""
    write: int
    """The write that last held the episode."""
    next_step: int
    """Step of the episode's next row in that write."""


class StepNumbering:
    """Assigns ``t`` to recorder rows chunk by chunk, remembering each episode."""

    def __init__(self) -> None:
        self._episodes: dict[object, _Cursor] = {}

    def number(
        self,
        eps_id: pa.Array,
        writes: np.ndarray,
        obs_hash: np.ndarray,
        new_obs_hash: np.ndarray | None,
        where: Callable[[int], str],
    ) -> np.ndarray:
        """Steps (int32) of rows in recording order; ``writes[i]`` is row ``i``'s write
        index, ``where(i)`` names its file for messages."""
        encoded = pc.dictionary_encode(eps_id)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        ids = encoded.dictionary.to_pylist()
        n = len(codes)
        order = np.lexsort((np.arange(n), writes, codes))
        code, write = codes[order], writes[order]
        starts = np.flatnonzero(np.r_[True, (code[1:] != code[:-1]) | (write[1:] != write[:-1])])
        ends = np.r_[starts[1:], n]
        steps = np.empty(n, dtype=np.int64)
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            rows = order[start:end]
            first, last = int(rows[0]), int(rows[-1])
            cursor = self._cursor(
                ids[code[start]], int(write[start]), obs_hash[first], where, first
            )
            step = cursor.next_step
            steps[rows] = np.arange(step, step + len(rows))
            cursor.next_step = step + len(rows)
            if cursor.next_step >= cursor.steps:
                cursor.steps = cursor.next_step
                cursor.last_new_obs = None if new_obs_hash is None else int(new_obs_hash[last])
        if n and steps.max() > np.iinfo(np.int32).max:
            raise DatasetError(f"{where(0)}: an episode has more than 2**31 steps")
        return steps.astype(np.int32)

    def _cursor(
        self, eps_id: object, write: int, obs_hash: int, where: Callable[[int], str], row: int
    ) -> _Cursor:
        """The episode's cursor, positioned at the step its rows in ``write`` start from."""
        cursor = self._episodes.get(eps_id)
        if cursor is None:
            cursor = _Cursor(0, int(obs_hash), None, write, 0)
            self._episodes[eps_id] = cursor
            return cursor
        if cursor.write == write:
            return cursor
        cursor.write = write
        if obs_hash == cursor.first_obs:
            cursor.next_step = 0
        elif cursor.last_new_obs is None or obs_hash == cursor.last_new_obs:
            cursor.next_step = cursor.steps
        else:
            raise DatasetError(
                f"{where(row)}: episode '{eps_id}' appears again, but its first row here neither "
                f"repeats the episode's step 0 nor continues its step {cursor.steps - 1} (its "
                "obs is not that step's new_obs); expected RLlib's recorder to rewrite an "
                "episode from its first step or to continue it (are two recordings mixed under "
                "one eps_id?)"
            )
        return cursor
