"""Parameter encoding (safetensors) and the digests that identify stored content.

Parameters ``{module_id: {param_name: Tensor}}`` are stored as ONE safetensors file whose
keys are ``"module_id/param_name"``: a version is one blob to write, hash, fsync and
export, and any safetensors reader can open it. The module list is kept in the file's
metadata so that a module without parameters survives the round trip.

The params digest describes the tensors, not the file bytes: it is the sha256 of a
canonical JSON document listing the sorted metadata and, in sorted key order, each
tensor's key, dtype, shape and the sha256 of its raw bytes. Two files with the same
tensors but a different header layout have the same digest; changing one byte of one
tensor, its dtype, its shape or the metadata changes it. Hashing tensor by tensor lets
reads hash on several cores and lets ``verify`` name the tensors that changed.

Nothing here imports torch at module level: reading, hashing and verifying a file only
needs the standard library (the CLI stays fast); torch is imported where tensors are
made or consumed.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.artifacts.errors import ArtifactError, IntegrityError

if TYPE_CHECKING:
    import torch

PARAMS_FILE = "params.safetensors"
TENSORS_FORMAT = "offmeta.tensors/1"
MODULES_KEY = "offmeta.modules"

# safetensors dtype code -> (torch dtype attribute, bytes per element).
_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "C64": ("complex64", 8),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U64": ("uint64", 8),
    "U32": ("uint32", 4),
    "U16": ("uint16", 2),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
}
# Below this many bytes, starting threads costs more than hashing on one core.
_PARALLEL_HASH_BYTES = 4 << 20


def sha256_hex(data: bytes | memoryview) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class TensorRecord:
    """One stored tensor: safetensors dtype code, shape and sha256 of its raw bytes."""

    dtype: str
    shape: tuple[int, ...]
    digest: str


@dataclass(frozen=True)
class EncodedParams:
    """A params blob's digest and per-tensor records (``streams.EncodedStream.encoded``)."""

    digest: str
    modules: tuple[str, ...]
    tensors: dict[str, TensorRecord]


def combine(metadata: Mapping[str, str], tensors: Mapping[str, TensorRecord]) -> str:
    """The params digest: sha256 of the canonical description of metadata and tensors."""
    document = {
        "format": TENSORS_FORMAT,
        "metadata": dict(sorted(metadata.items())),
        "tensors": [
            [key, tensors[key].dtype, list(tensors[key].shape), tensors[key].digest]
            for key in sorted(tensors)
        ],
    }
    canonical = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return sha256_hex(canonical.encode("ascii"))


def _hash_all(chunks: Sequence[memoryview], parallel: bool) -> list[str]:
    # hashlib releases the GIL on large buffers, so threads use several cores.
    total = sum(chunk.nbytes for chunk in chunks)
    workers = min(len(chunks), os.cpu_count() or 1)
    if not parallel or workers < 2 or total < _PARALLEL_HASH_BYTES:
        return [sha256_hex(chunk) for chunk in chunks]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(sha256_hex, chunks))


# ---------------------------------------------------------------------------- writing


def flatten_params(params: object) -> tuple[tuple[str, ...], dict[str, torch.Tensor]]:
    """Check ``{module_id: {param_name: Tensor}}`` and flatten it to ``"module/param"`` keys.

    Tensors are detached, moved to CPU and made contiguous; a tensor sharing memory with
    an earlier one is cloned (safetensors refuses shared storage).
    """
    import torch

    if not isinstance(params, Mapping):
        raise ArtifactError(
            f"params must be a dict {{module_id: {{param_name: Tensor}}}}, "
            f"got {type(params).__name__}"
        )
    flat: dict[str, torch.Tensor] = {}
    seen_storage: set[int] = set()
    for module_id, module_params in params.items():
        if not isinstance(module_id, str) or not module_id or "/" in module_id:
            raise ArtifactError(
                f"params: module id {module_id!r} must be a non-empty string without '/'"
            )
        if not isinstance(module_params, Mapping):
            raise ArtifactError(
                f"params[{module_id!r}] must be a dict {{param_name: Tensor}}, "
                f"got {type(module_params).__name__}"
            )
        for param_name, tensor in module_params.items():
            where = f"params[{module_id!r}][{param_name!r}]"
            if not isinstance(param_name, str) or not param_name:
                raise ArtifactError(f"{where}: parameter names must be non-empty strings")
            if not isinstance(tensor, torch.Tensor):
                raise ArtifactError(f"{where} must be a torch.Tensor, got {type(tensor).__name__}")
            if tensor.layout != torch.strided:
                raise ArtifactError(
                    f"{where} has layout {tensor.layout}; only dense tensors can be stored "
                    f"(call .to_dense() first)"
                )
            if dtype_code(tensor.dtype) is None:
                raise ArtifactError(
                    f"{where} has dtype {tensor.dtype}, which safetensors cannot store; "
                    f"supported: {', '.join(sorted(_DTYPES))}"
                )
            tensor = tensor.detach().to("cpu").contiguous()
            storage = tensor.untyped_storage().data_ptr()
            if tensor.numel() and storage in seen_storage:
                tensor = tensor.clone()
            seen_storage.add(tensor.untyped_storage().data_ptr())
            flat[f"{module_id}/{param_name}"] = tensor
    return tuple(sorted(params)), flat


def itemsize(code: str) -> int:
    """Bytes per element of a safetensors dtype code (``"F32"`` -> 4)."""
    return _DTYPES[code][1]


def dtype_code(dtype: torch.dtype) -> str | None:
    """The safetensors code of a torch dtype (``torch.float32`` -> ``"F32"``), or None."""
    import torch

    for code, (attribute, _) in _DTYPES.items():
        if getattr(torch, attribute, None) == dtype:
            return code
    return None


# ---------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Entry:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class ParsedParams:
    """A params file read into memory and its parsed header (offsets relative to ``buffer``)."""

    buffer: memoryview
    """Writable; the tensors ``decode_params`` returns are views into it."""
    metadata: dict[str, str]
    entries: dict[str, _Entry]

    @property
    def modules(self) -> tuple[str, ...]:
        listed = self.metadata.get(MODULES_KEY)
        if listed is not None:
            return tuple(json.loads(listed))
        return tuple(sorted({key.split("/", 1)[0] for key in self.entries}))


def read_params(path: Path) -> ParsedParams:
    """Read a params file once into memory and parse its header."""
    return parse_params(memoryview(bytearray(path.read_bytes())), str(path))


def parse_params(buffer: memoryview, where: str) -> ParsedParams:
    """Parse the header of a params file held in ``buffer`` (``where`` names it in errors).

    Verification and decoding both work on this one buffer, so the bytes that were
    checked are the bytes that become tensors.
    """
    parsed = _parse_header(buffer, where, data_length=len(buffer))
    return ParsedParams(buffer, parsed.metadata, parsed.entries)


def params_digest(parsed: ParsedParams) -> tuple[str, dict[str, TensorRecord]]:
    """Recompute the params digest of a file read by ``read_params``."""
    keys = sorted(parsed.entries)
    view = parsed.buffer
    chunks = [view[parsed.entries[key].begin : parsed.entries[key].end] for key in keys]
    digests = _hash_all(chunks, parallel=True)
    tensors = {
        key: TensorRecord(parsed.entries[key].dtype, parsed.entries[key].shape, digest)
        for key, digest in zip(keys, digests, strict=True)
    }
    return combine(parsed.metadata, tensors), tensors


def decode_params(
    parsed: ParsedParams, device: str | torch.device
) -> dict[str, dict[str, torch.Tensor]]:
    """Tensors of a verified file as ``{module_id: {param_name: Tensor}}`` on ``device``.

    CPU tensors are views into the one buffer that was read and hashed (no copy); a
    tensor whose offset is not aligned to its element size is copied out.
    """
    import torch

    result: dict[str, dict[str, torch.Tensor]] = {module: {} for module in parsed.modules}
    for key in sorted(parsed.entries):
        entry = parsed.entries[key]
        attribute, element_size = _DTYPES[entry.dtype]
        dtype = getattr(torch, attribute)
        count = (entry.end - entry.begin) // element_size
        if count == 0:
            tensor = torch.empty(entry.shape, dtype=dtype)
        else:
            tensor = torch.frombuffer(parsed.buffer, dtype=dtype, count=count, offset=entry.begin)
            tensor = tensor.reshape(entry.shape)
            if tensor.data_ptr() % element_size:
                tensor = tensor.clone()
        module_id, param_name = key.split("/", 1)
        result.setdefault(module_id, {})[param_name] = tensor.to(device)
    return result


@dataclass(frozen=True)
class _Header:
    metadata: dict[str, str]
    entries: dict[str, _Entry]


def _parse_header(data: bytes | memoryview, where: str, data_length: int | None) -> _Header:
    """Parse a safetensors header; offsets returned are absolute within the file.

    ``data_length`` is the file size when the whole file is in ``data`` (then every
    tensor's byte range is checked against it), None when only the header was read.
    """

    def bad(reason: str) -> IntegrityError:
        return IntegrityError([f"{where} is not a readable safetensors file: {reason}"])

    if len(data) < 8:
        raise bad(f"it is {len(data)} bytes long, shorter than the 8-byte header length")
    header_length = int.from_bytes(data[:8], "little")
    if 8 + header_length > len(data):
        raise bad(f"the header claims {header_length} bytes but the file has {len(data) - 8}")
    try:
        header = json.loads(bytes(data[8 : 8 + header_length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise bad(f"the header is a JSON {type(header).__name__}, expected an object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise bad("__metadata__ must map strings to strings")
    start = 8 + header_length
    entries = {key: _entry(key, spec, start, data_length, bad) for key, spec in header.items()}
    return _Header(metadata, entries)


def _entry(
    key: str,
    spec: object,
    start: int,
    data_length: int | None,
    bad: Callable[[str], IntegrityError],
) -> _Entry:
    if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPES:
        raise bad(f"tensor {key!r} has no known dtype (found {spec!r})")
    shape = spec.get("shape")
    offsets = spec.get("data_offsets")
    if not _is_int_list(shape) or not _is_int_list(offsets) or len(offsets) != 2:
        raise bad(f"tensor {key!r} needs an integer shape and two data_offsets, found {spec!r}")
    begin, end = start + offsets[0], start + offsets[1]
    count = 1
    for dim in shape:
        count *= dim
    if end < begin or end - begin != count * _DTYPES[spec["dtype"]][1]:
        raise bad(f"tensor {key!r} offsets {offsets} do not fit dtype {spec['dtype']} {shape}")
    if data_length is not None and end > data_length:
        raise bad(f"tensor {key!r} ends at byte {end}, past the end of the file ({data_length})")
    if "/" not in key:
        raise bad(f"tensor key {key!r} is not of the form 'module_id/param_name'")
    return _Entry(spec["dtype"], tuple(shape), begin, end)


def _is_int_list(value: object) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value
    )


def describe(tensors: Iterable[str]) -> str:
    """``"a/w, a/b"`` capped at a few keys, for error messages."""
    keys = sorted(tensors)
    shown = ", ".join(repr(key) for key in keys[:5])
    return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
