"""glibc malloc in a training process: freed memory kept for the next meta-step.

A meta-step frees what it allocated (activations, gradients, the meta-batch it read) and the
next one allocates it again. With glibc's defaults, blocks above its mmap threshold (128 KiB
at first, raised as they are freed) are mapped and unmapped each time, and free memory at
the top of the heap past its trim threshold goes back to the kernel: the next step faults
every page of it in again. Measured with ``bench/run_rate.py`` (docs/performance.md): the
run's training thread took 220-2,270 minor page faults per step that the bare step did not,
0.7-5.3 ms of system time on a step of 13-14 ms.

``keep_freed_memory`` sets, through ``mallopt``, a fixed mmap threshold of 32 MiB (glibc's
own ceiling for the dynamic one) and a trim threshold of 256 MiB: blocks below 32 MiB come
from the heap and stay there when freed, and up to 256 MiB of free heap top is kept. The
process then holds its peak heap (plus up to 256 MiB) until it ends, which a training
process reaches in its first steps anyway. ``offmeta run`` and Ray Train workers call it;
``OFFMETA_MALLOC=system`` (or either ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``
set in the environment, glibc's own switches) leaves malloc as it is. Not glibc (macOS, musl):
nothing to do.
"""

from __future__ import annotations

import ctypes
import logging
import os

_log = logging.getLogger(__name__)

MMAP_THRESHOLD = 32 * 2**20
TRIM_THRESHOLD = 256 * 2**20
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
SWITCH = "OFFMETA_MALLOC"
"""Environment variable: ``system`` leaves glibc's defaults; ``keep`` (or unset) applies."""


def keep_freed_memory() -> bool:
    """Apply the module's malloc settings to this process; True when they were applied."""
    choice = os.environ.get(SWITCH, "keep")
    if choice not in ("keep", "system"):
        raise ValueError(f"{SWITCH}={choice!r}: expected 'keep' or 'system'")
    if choice == "system" or any(
        name in os.environ for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
    ):
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    applied = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    applied = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and applied
    if not applied:
        _log.warning("glibc's mallopt refused the training process's malloc settings")
    return applied


def _mallopt():
    """glibc's ``mallopt``, or None where this process's C library is not glibc. Looked up
    among the symbols the process already has (``ctypes.CDLL(None)``): no search of the
    library path (``ctypes.util.find_library`` runs ldconfig or a compiler for it) in the
    start-up of every run and Ray Train worker."""
    try:
        libc = ctypes.CDLL(None)
        function = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
    except (OSError, AttributeError, TypeError):  # TypeError: no CDLL(None) off POSIX
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int]
    function.restype = ctypes.c_int
    return function
