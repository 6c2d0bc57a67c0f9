"""Which failures a retry can fix: one policy for the flow's task retries and for the errors
Ray Train workers raise.

Bad input (``ValueError``, ``TypeError``: the dataset, the config), a feature the chosen
setup lacks (``NotImplementedError``), non-finite arithmetic (``ArithmeticError``) and a
cluster set up so that its workers cannot reach the run's storage or import offmeta
(``ClusterSetupError``, raised after Ray Train's own restarts) fail the same way every time,
so they fail at once. Anything else (a lost worker, a full disk, a flaky filesystem) may pass
on a second attempt.
"""

from __future__ import annotations


class ClusterSetupError(RuntimeError):
    """Ray Train workers cannot reach what every node needs: the run's storage, or offmeta's
    code; the message names the fix."""


PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    NotImplementedError,
    ArithmeticError,
    ClusterSetupError,
)


def is_permanent(error: BaseException | None) -> bool:
    """True when retrying after ``error`` would fail the same way."""
    return isinstance(error, PERMANENT_ERRORS)
