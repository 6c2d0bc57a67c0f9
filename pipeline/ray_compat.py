"""Every call offmeta makes into Ray's private or internal names, in one place.

Checked against Ray 2.60.x (2.60.0). Ray changes these names between minor versions
without notice, so importing this module under any other minor version raises
``ImportError`` instead of failing somewhere inside a read: an upgrade is a change to this
file (and a run of the tests) alone. Each function below names the private API it uses
and why no public one serves. ``tests/pipeline/test_ray_compat.py`` fails when a module
outside this one names a private Ray attribute.

Importing it imports Ray Data. Modules that import Ray only inside the functions that
use it, so that importing the pipeline does not pay for Ray, import this one there too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import ray

SUPPORTED_SERIES = (2, 60)
"""The Ray ``major.minor`` whose private names this module was checked against."""


def check_ray_version(found: str) -> None:
    """Raise ``ImportError`` unless ``found`` (a Ray version string) is of the supported
    series (any 2.60.x, pre-releases included)."""
    parts = found.split(".")
    series = tuple(int(part) if part.isdigit() else -1 for part in parts[:2])
    if series != SUPPORTED_SERIES:
        expected = ".".join(map(str, SUPPORTED_SERIES))
        raise ImportError(
            f"offmeta supports ray {expected}.x (found {found}): its calls into Ray's private "
            f"API (pipeline/ray_compat.py) were checked against that series only; install "
            f"ray=={expected}.*"
        )


check_ray_version(ray.__version__)

# After the version check: under another Ray, ray.data itself may fail to import with an
# error that says nothing about versions.
import ray.data  # noqa: E402

QUIET_LOGGERS = {
    # Ray Data logs every execution at INFO (it configures this logger when imported).
    "ray.data": logging.WARNING,
    # "Started a local Ray instance." ray.init resets the "ray" logger itself to INFO, so
    # the level goes on the private module that logs it: Ray has no setting for this line.
    "ray._private.worker": logging.WARNING,
    # Token authentication is on by default; the warning only says how to turn it off, and
    # it comes from a private module's logger (no setting silences it).
    "ray._private.authentication": logging.ERROR,
}
"""Logger names -> the level that keeps Ray's start-up and execution chatter quiet."""


def drop_off_main_thread_warning() -> None:
    """Drop the warning ``ray.init`` logs when it runs off the main thread (that it set no
    SIGTERM handler): ``flows.process.runtime.RayStart`` starts Ray on a thread of its own, and
    ``offmeta run`` handles SIGTERM itself (``flows.process.signals``). Private: the line
    comes from ``ray._private.worker``'s logger, and Ray has no setting for it."""
    logging.getLogger("ray._private.worker").addFilter(_not_the_main_thread_warning)


def _not_the_main_thread_warning(record: logging.LogRecord) -> bool:
    return "SIGTERM handler is not set" not in record.getMessage()


def isolated_copy(dataset: ray.data.Dataset) -> ray.data.Dataset:
    """A copy of ``dataset`` with a context of its own, so that settings made on the copy
    (block size, execution options) leave the caller's dataset as it was.

    Uses ``Dataset.copy(..., _deep_copy=True)``: the public ``Dataset`` methods share the
    context of the dataset they derive from, and only the private argument copies it.
    """
    return ray.data.Dataset.copy(dataset, _deep_copy=True)


def ref_bundles(dataset: ray.data.Dataset) -> Iterator[Any]:
    """The ``RefBundle``s (object references to blocks) of executing ``dataset``, each the
    moment it exists.

    Uses ``Dataset.iter_internal_ref_bundles`` (a DeveloperAPI handing out an internal
    type): ``iter_batches`` re-batches and copies on the driver, and holds the
    execution's scheduling loop until the consumer takes each batch (see
    ``pipeline.rows.read_ahead``); ``to_arrow_refs`` waits for the whole execution.
    """
    return dataset.iter_internal_ref_bundles()


def bundle_tables(bundle: Any) -> Iterator[pa.Table]:
    """The blocks of one ``RefBundle`` as Arrow tables; a bundle may hold a row range of
    a block (after a ``limit``, say), which is honoured.

    Reads the ``RefBundle`` fields ``block_refs`` and ``slices`` (an internal type of
    ``ray.data._internal.execution``): no public API turns a bundle into its blocks.
    """
    refs = bundle.block_refs
    slices = getattr(bundle, "slices", None) or (None,) * len(refs)
    for ref, piece in zip(refs, slices, strict=True):
        block = ray.get(ref)
        if not isinstance(block, pa.Table):
            block = pa.Table.from_pandas(block, preserve_index=False)
        if piece is not None:
            block = block.slice(piece.start_offset, piece.end_offset - piece.start_offset)
        yield block


def with_backpressure(remote_function: Any, ahead: int) -> Any:
    """``remote_function`` as a streaming generator that yields at most ``ahead`` objects
    its caller has not taken yet.

    Uses the private option ``_generator_backpressure_num_objects``: without it a
    streaming generator runs to its end whatever the consumer's pace, and a file far
    larger than a window would fill the object store.
    """
    return remote_function.options(
        num_returns="streaming", _generator_backpressure_num_objects=ahead
    )


def start_without_projection(datasource: Any) -> None:
    """Give a ``Datasource`` that pushes column selections down its initial projection
    (every column).

    Sets ``_projection_map``: Ray's projection-pushdown mixin keeps the selection there
    and reads it in ``apply_projection`` and ``get_projection_map``, but
    ``Datasource.__init__`` does not set it, and no public setter exists.
    """
    datasource._projection_map = None


def projected_columns(datasource: Any) -> list[str] | None:
    """The columns Ray pushed down into ``datasource`` (``None``: every column).

    Public (``get_projection_map``), kept here beside ``start_without_projection``: the two
    follow the same mixin, which Ray reworks between versions.
    """
    projection = datasource.get_projection_map()
    return None if projection is None else list(projection)
