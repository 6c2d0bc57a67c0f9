"""How much Ray prints when offmeta uses it: quiet by default, Ray's own output with
``OFFMETA_VERBOSE=1``.

Left alone, every read prints about 20 INFO lines (Ray starting, Parquet size estimates,
execution plans, progress logged line by line when stdout is not a terminal), a warning that
tqdm is missing and one about token authentication. They describe Ray's machinery, not the
user's data, so offmeta silences them for the process the first time it reads (or, for
``offmeta run``, when it starts Ray); Ray's warnings about anything else and all errors still
print. ``OFFMETA_VERBOSE=1`` leaves Ray's logging and progress settings as Ray has them.
"""

from __future__ import annotations

import logging
import os

VERBOSE_ENV = "OFFMETA_VERBOSE"


def verbose() -> bool:
    """Whether ``OFFMETA_VERBOSE`` asks for Ray's own output (``1``; ``0`` or unset: quiet)."""
    value = os.environ.get(VERBOSE_ENV, "")
    if value not in ("", "0", "1"):
        raise ValueError(
            f"{VERBOSE_ENV}={value!r}: expected 1 (show Ray's logs and progress) or 0 / unset "
            "(quiet)"
        )
    return value == "1"


def quiet_ray() -> None:
    """Silence Ray's INFO lines, progress output and start-up warnings in this process,
    unless ``OFFMETA_VERBOSE=1``. Imports ``ray.data``; call it before Ray starts."""
    if verbose():
        return
    import ray.data
    from ray.util.debug import log_once

    from pipeline.ray_compat import QUIET_LOGGERS

    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    # Ray Data warns once per process that progress bars are off; they are off on purpose.
    log_once("ray_data_progress_manager_disabled")
