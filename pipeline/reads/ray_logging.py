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

_LEVELS = {
    # Ray Data logs every execution at INFO (it configures this logger when imported).
    "ray.data": logging.WARNING,
    # "Started a local Ray instance." ray.init resets the "ray" logger itself to INFO,
    # so the level goes on the module's own logger.
    "ray._private.worker": logging.WARNING,
    # Token authentication is on by default; the warning only says how to turn it off.
    "ray._private.authentication": logging.ERROR,
}


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

    for name, level in _LEVELS.items():
        logging.getLogger(name).setLevel(level)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    # Ray Data warns once per process that progress bars are off; they are off on purpose.
    log_once("ray_data_progress_manager_disabled")
