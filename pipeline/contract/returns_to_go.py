"""The discounted return-to-go of one episode's rewards, the arithmetic of the ``returns``
column (``pipeline.reads.returns`` derives the column at ingest; the value checks gather its
statistics for ``data.normalize``, ``pipeline.contract.feature_stats``).
"""

from __future__ import annotations

import numpy as np

RETURNS_COLUMN = "returns"


def check_gamma(gamma: float | None) -> None:
    """Refuse a discount outside [0, 1]."""
    if gamma is None:
        return
    if isinstance(gamma, bool) or not isinstance(gamma, int | float) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be a number in [0, 1], got {gamma!r}")


def discounted_returns(rewards: np.ndarray, starts: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go of every row, float64, for rows in episode order whose episodes begin
    at the ascending positions ``starts`` (``starts[0] == 0``); no bootstrap at the end."""
    check_gamma(gamma)
    rewards = np.asarray(rewards, dtype=np.float64)
    n = len(rewards)
    if n == 0:
        return rewards.copy()
    lengths = np.diff(np.append(starts, n))
    # Rows after each row within its episode.
    remaining = np.repeat(starts + lengths, lengths) - 1 - np.arange(n)
    total, shift, factor = rewards.copy(), 1, float(gamma)
    while shift <= remaining.max():
        # total[i] sums the `shift` rewards from row i (fewer at the episode's end);
        # adding the next `shift`, discounted, doubles the span.
        later = np.zeros(n)
        later[:-shift] = total[shift:]
        total = total + np.where(remaining >= shift, factor * later, 0.0)
        shift, factor = 2 * shift, factor * factor
    return total
