"""Checkpoints of a training run: nested state (learner state, stream positions, history)
saved as safetensors files of tensors plus JSON documents of everything else.

No pickle anywhere: a checkpoint can be read by any safetensors + JSON reader and loading
one never runs code. A checkpoint is a directory holding one *shard* per learner of the
run, ``learner-<rank>.safetensors`` + ``learner-<rank>.json`` (one learner in process, one
per Ray Train worker, whose directories Ray Train merges into one). ``save_checkpoint``
writes a one-learner checkpoint ``ckpt-<step:08d>/`` under a temporary name and renames it
into place, so a reader sees either a whole checkpoint or none; ``latest_checkpoint`` is the
highest step present.

The JSON document mirrors the state's nesting. Tensors become ``{"__tensor__": key}``;
tuples, dicts with non-string keys and non-finite floats get tagged forms too, so that
``decode_state(*encode_state(s))`` gives back exactly ``s`` (int keys of an optimizer
state stay ints, Adam's ``betas`` stay a tuple).
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from pipeline.io.fsio import fsync_dir, write_file

FORMAT = 1
_NAME = re.compile(r"ckpt-(\d{8})")
_SHARD = re.compile(r"learner-(\d+)\.json")
_TAGS = ("__tensor__", "__tuple__", "__dict__", "__float__")


class CheckpointError(ValueError):
    """A checkpoint could not be written or read; the message names the file and the entry."""


@dataclass(frozen=True)
class Checkpoint:
    """One loaded checkpoint."""

    step: int
    """The step (iteration) it was taken after."""
    state: dict[str, Any]
    """The state of learner 0 as it was saved (tensors on CPU)."""
    path: Path


def shard_files(rank: int) -> tuple[str, str]:
    """``(tensor file, JSON file)`` names of learner ``rank``'s shard in a checkpoint."""
    return f"learner-{rank}.safetensors", f"learner-{rank}.json"


def write_shard(
    directory: str | os.PathLike[str], rank: int, state: Mapping[str, Any], *, durable: bool
) -> None:
    """Write learner ``rank``'s ``state`` into the checkpoint ``directory`` (the JSON document
    last: a shard whose JSON file exists is complete, even if a filesystem ignored fsyncs)."""
    tensor_bytes, json_bytes = dump_state(state)
    for name, data in zip(shard_files(rank), (tensor_bytes, json_bytes), strict=True):
        write_file(Path(directory) / name, data, durable=durable)


def read_shard(directory: str | os.PathLike[str], rank: int) -> dict[str, Any]:
    """What learner ``rank`` saved in the checkpoint ``directory`` (tensors on CPU)."""
    directory = Path(directory)
    tensor_file, json_file = shard_files(rank)
    try:
        tensor_bytes = (directory / tensor_file).read_bytes()
        json_bytes = (directory / json_file).read_bytes()
    except OSError as error:
        raise CheckpointError(
            f"checkpoint {directory}: cannot read {error.filename}: {error.strerror}"
        ) from None
    return parse_state(tensor_bytes, json_bytes, where=f"{directory}/learner-{rank}")


def shard_ranks(directory: str | os.PathLike[str]) -> list[int]:
    """The ranks of the learners whose shards the checkpoint ``directory`` holds, sorted."""
    names = (entry.name for entry in Path(directory).iterdir())
    return sorted(int(match.group(1)) for name in names if (match := _SHARD.fullmatch(name)))


def encode_state(state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(json_document, tensors)``: the state's structure as JSON with tensor references,
    and the tensors by reference key (CPU, contiguous, not sharing memory)."""
    tensors: dict[str, torch.Tensor] = {}
    document = _encode(dict(state), tensors, "state")
    return {"format": FORMAT, "state": document}, tensors


def decode_state(
    document: Mapping[str, Any], tensors: Mapping[str, torch.Tensor], *, where: str = "state"
) -> dict[str, Any]:
    """The state ``encode_state`` was given, rebuilt from its two parts."""
    if document.get("format") != FORMAT or "state" not in document:
        raise CheckpointError(
            f"{where}: format {document.get('format')!r} is not checkpoint format {FORMAT}"
        )
    return _decode(document["state"], tensors, where)


def dump_state(state: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """``(safetensors bytes, JSON bytes)`` of a state, e.g. to attach to an artifact."""
    document, tensors = encode_state(state)
    return save_tensors(tensors), _json_bytes(document)


def parse_state(tensor_bytes: bytes, json_bytes: bytes, *, where: str = "state") -> dict[str, Any]:
    """The inverse of ``dump_state``."""
    try:
        document = json.loads(json_bytes)
        tensors = load_tensors(tensor_bytes)
    except (ValueError, RuntimeError) as error:
        raise CheckpointError(f"{where}: unreadable ({error})") from None
    return decode_state(document, tensors, where=where)


def save_checkpoint(
    directory: str | os.PathLike[str],
    step: int,
    state: Mapping[str, Any],
    *,
    keep: int | None = None,
) -> Path:
    """Write ``state`` as the one-learner checkpoint ``step`` under ``directory`` (learner
    0's shard); returns its path.

    The checkpoint appears atomically (temporary directory, fsync, rename). A checkpoint
    of the same step is replaced. With ``keep``, only the newest ``keep`` checkpoints stay.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step must be an int >= 0, got {step!r}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".tmp-{step:08d}-{os.getpid()}-{secrets.token_hex(4)}"
    staging.mkdir()
    try:
        write_shard(staging, 0, state, durable=True)
        fsync_dir(staging)
        final = root / f"ckpt-{step:08d}"
        if final.exists():
            retired = root / f".old-{step:08d}-{secrets.token_hex(4)}"
            final.rename(retired)
            shutil.rmtree(retired, ignore_errors=True)
        staging.rename(final)
        fsync_dir(root)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    if keep is not None:
        for _, old in _checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint with the highest step under ``directory``; None when there is none."""
    found = _checkpoints(Path(directory))
    return found[-1][1] if found else None


def load_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """Read learner 0's shard of a checkpoint written by ``save_checkpoint``; tensors come
    back on CPU (``MetaLearner.set_state`` and ``torch.optim`` move them to the parameters'
    device)."""
    path = Path(path)
    match = _NAME.fullmatch(path.name)
    if match is None:
        raise CheckpointError(f"{path} is not a checkpoint directory (expected ckpt-NNNNNNNN)")
    return Checkpoint(step=int(match.group(1)), state=read_shard(path, 0), path=path)


def _checkpoints(root: Path) -> list[tuple[int, Path]]:
    try:
        entries = list(root.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _NAME.fullmatch(entry.name)
        if match and (entry / shard_files(0)[1]).is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found)


def _encode(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(value, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = value.detach().to("cpu", copy=True).contiguous()
        return {"__tensor__": key}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, tensors, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, Mapping):
        plain = all(isinstance(k, str) and k not in _TAGS for k in value)
        if plain:
            return {k: _encode(v, tensors, f"{where}[{k!r}]") for k, v in value.items()}
        items = []
        for k, v in value.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise CheckpointError(
                    f"{where} has the key {k!r} ({type(k).__name__}); checkpoint keys must be "
                    "strings or ints"
                )
            items.append([k, _encode(v, tensors, f"{where}[{k!r}]")])
        return {"__dict__": items}
    raise CheckpointError(
        f"{where} is a {type(value).__name__}; checkpoints hold tensors, numbers, strings, "
        "None, lists, tuples and dicts"
    )


def _decode(value: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    if isinstance(value, list):
        return [_decode(v, tensors, where) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "__tensor__":
            if inner not in tensors:
                raise CheckpointError(
                    f"{where}: tensor {inner!r} is missing from the safetensors file"
                )
            return tensors[inner]
        if tag == "__tuple__":
            return tuple(_decode(v, tensors, where) for v in inner)
        if tag == "__dict__":
            return {k: _decode(v, tensors, where) for k, v in inner}
        if tag == "__float__":
            return float(inner)
    return {k: _decode(v, tensors, where) for k, v in value.items()}


def _json_bytes(document: Mapping[str, Any]) -> bytes:
    return (json.dumps(document, indent=1, allow_nan=False) + "\n").encode()
