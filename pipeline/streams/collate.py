"""Collate (Arrow rows -> CPU tensors grouped per module) and finalize (tensors -> device).

Both are module-level callables with no state of their own, so a stream, a test or a
Ray Train worker can call them the same way.

A minibatch (``Batch``) is ``{module_id: {column: Tensor}}``. A module with no row in a
minibatch is absent from it. Rows are grouped per module with one stable argsort over
``(minibatch, module code)`` and one gather per column; every minibatch tensor is then a
view into that gathered buffer, so slicing a super-batch into minibatches copies nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from pipeline.contract.schema import ObservationLayout
from pipeline.streams.columns import column_array, default_columns, module_codes

Batch = dict[str, dict[str, torch.Tensor]]
"""``{module_id: {column: Tensor}}``; a meta-batch is ``{"support": Batch, "query": Batch}``."""

IMAGE_COLUMNS = ("obs", "new_obs")
"""Columns whose uint8 tensors are images that finalize turns into float on the device."""


def collate(
    table: pa.Table,
    *,
    columns: Sequence[str] | None = None,
    modules_to_update: Collection[str] | None = None,
) -> Batch:
    """Turn the rows of ``table`` into one minibatch ``{module_id: {column: Tensor}}``.

    Rows without a ``module_id`` column belong to ``DEFAULT_MODULE_ID``; rows of modules
    outside ``modules_to_update`` (when given) are dropped. ``columns`` defaults to the
    training columns present in ``table``.
    """
    if table.num_rows == 0:
        return {}
    order = np.arange(table.num_rows)
    return collate_minibatches(
        table,
        order,
        table.num_rows,
        columns=columns,
        modules_to_update=modules_to_update,
    )[0]


def collate_minibatches(
    table: pa.Table,
    order: np.ndarray,
    minibatch_size: int,
    *,
    columns: Sequence[str] | None = None,
    modules_to_update: Collection[str] | None = None,
    pin_memory: bool = False,
) -> list[Batch]:
    """Cut ``table`` into ``len(order) // minibatch_size`` minibatches in one pass.

    Minibatch ``i`` holds the rows ``order[i * minibatch_size:(i + 1) * minibatch_size]``
    (``order`` carries the shuffle), grouped per module. ``pin_memory`` gathers straight
    into page-locked buffers so that ``finalize`` can copy them to a GPU asynchronously.
    """
    if minibatch_size < 1 or len(order) % minibatch_size:
        raise ValueError(
            f"collate_minibatches: {len(order)} rows do not divide into minibatches of "
            f"{minibatch_size}; pass a whole number of minibatches"
        )
    columns = tuple(default_columns(table.column_names) if columns is None else columns)
    _check_columns(table, columns)
    codes, names = module_codes(table)
    order = np.asarray(order, dtype=np.int64)
    num_batches = len(order) // minibatch_size
    if num_batches == 0:
        return []
    # Group (minibatch, module) of every row: small keys, since numpy's stable sort is a
    # radix sort for 16 bits or less, one pass per byte.
    num_groups = num_batches * len(names)
    small = next((t for t in (np.uint8, np.uint16) if num_groups <= np.iinfo(t).max), np.int64)
    key = np.repeat(np.arange(0, num_groups, len(names), dtype=small), minibatch_size)
    if modules_to_update is not None:
        wanted = np.array([name in modules_to_update for name in names], dtype=bool)
        kept = wanted[codes[order]]
        order, key = order[kept], key[kept]
    if len(names) > 1:
        key += codes[order].astype(small)
        order = order[np.argsort(key, kind="stable")]
    counts = np.bincount(key, minlength=num_groups).tolist()
    # One split per column: views for every (minibatch, module) group in a single call.
    parts = {
        name: gather(column_array(table, name), order, pin_memory).split(counts) for name in columns
    }
    views = zip(*parts.values(), strict=True) if parts else ((),) * len(counts)
    groups = [dict(zip(columns, group, strict=True)) for group in views]
    batches: list[Batch] = []
    for first in range(0, len(groups), len(names)):
        batches.append(
            {
                module: groups[first + code]
                for code, module in enumerate(names)
                if counts[first + code]
            }
        )
    return batches


def gather(array: np.ndarray, order: np.ndarray, pin_memory: bool = False) -> torch.Tensor:
    """``array[order]`` (``order`` of any shape) as a tensor owning its memory, page-locked
    with ``pin_memory``."""
    if not pin_memory:
        # Fancy indexing copies one-dimensional columns 2-3x faster than np.take; np.take
        # copies rows of tensors 3x faster than fancy indexing.
        return torch.from_numpy(array[order] if array.ndim == 1 else np.take(array, order, axis=0))
    shape = (*np.shape(order), *array.shape[1:])
    out = torch.empty(shape, dtype=torch.from_numpy(array[:0]).dtype, pin_memory=True)
    np.take(array, order, axis=0, out=out.numpy())
    return out


def finalize(
    batch: Mapping[str, Any],
    device: torch.device | str,
    *,
    non_blocking: bool = True,
    obs_layout: ObservationLayout | None = None,
):
    """Move every tensor of a (meta-)batch to ``device``, keeping the nesting.

    CPU: the tensors are returned as they are (no copy, no pinning). CUDA: each tensor is
    pinned if it is not already, copied with ``non_blocking`` on a side stream, and the
    current (compute) stream waits for that copy; ``record_stream`` keeps the caching
    allocator from reusing the memory while the compute stream may still read it.

    uint8 ``obs`` and ``new_obs`` (images) cross as uint8, a quarter of float32's bytes,
    and become float32 in ``[0, 1]`` on ``device``, ``[..., C, H, W]`` whatever
    ``obs_layout`` (the stored axis order, ``CHW`` when ``None``) they came in.
    """
    device = torch.device(device)
    if device.type == "cpu":
        moved = _map_tensors(batch, lambda tensor: tensor.cpu())
    elif device.type != "cuda":
        moved = _map_tensors(batch, lambda tensor: tensor.to(device, non_blocking=non_blocking))
    else:
        compute = torch.cuda.current_stream(device)
        side = _side_stream(device)
        with torch.cuda.stream(side):
            moved = _map_tensors(batch, lambda tensor: _copy_to_cuda(tensor, device, non_blocking))
        compute.wait_stream(side)
        _map_tensors(moved, lambda tensor: tensor.record_stream(compute))
    return _images_to_float(moved, obs_layout or "CHW")


def _images_to_float(value: Any, layout: ObservationLayout) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {
        key: (
            _image_to_float(item, layout)
            if key in IMAGE_COLUMNS and isinstance(item, torch.Tensor) and item.dtype == torch.uint8
            else _images_to_float(item, layout)
        )
        for key, item in value.items()
    }


def _image_to_float(images: torch.Tensor, layout: ObservationLayout) -> torch.Tensor:
    if layout == "HWC":
        images = images.movedim(-1, -3)
    return images.to(torch.float32, memory_format=torch.contiguous_format).div_(255.0)


def _copy_to_cuda(tensor: torch.Tensor, device: torch.device, non_blocking: bool) -> torch.Tensor:
    if non_blocking and not tensor.is_cuda and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=non_blocking)


_streams = threading.local()


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    # One copy stream per consumer thread and device: learners in threads each wait only
    # on their own copies.
    cache = _streams.__dict__.setdefault("by_device", {})
    if device not in cache:
        cache[device] = torch.cuda.Stream(device)
    return cache[device]


def _map_tensors(value: Any, fn):
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, Mapping):
        return {key: _map_tensors(item, fn) for key, item in value.items()}
    raise TypeError(f"finalize: expected nested dicts of tensors, found {type(value).__name__}")


def _check_columns(table: pa.Table, columns: Sequence[str]) -> None:
    # Not table.column_names: it builds a list of every name, per call.
    missing = [name for name in columns if table.schema.get_field_index(name) < 0]
    if missing:
        raise ValueError(
            f"columns {missing} are not in the data; available: {sorted(table.column_names)}"
        )
