"""Params blobs as streams of buffers: written from the tensors' memory, hashed as they move.

A params blob is a safetensors file: the header length (8 bytes, little-endian), a JSON
header padded with spaces to a multiple of 8, then each tensor's raw bytes. ``encode_params``
lays it out as a list of buffers, the header and then views of the tensors' own memory, so
that writing or uploading it copies nothing first. Tensors are ordered as safetensors orders
them (wider element types first, then by key): every tensor then starts at a multiple of its
element size, and any safetensors reader opens the file.

``TensorHashes`` hashes tensors on worker threads (hashlib releases the GIL on large
buffers) while the caller writes, uploads or receives the bytes: a publish hashes while
the file is written and fsynced, and a verified read hashes each tensor as soon as its
bytes have arrived, so the bytes are never read a second time to be hashed.
"""

from __future__ import annotations

import bisect
import io
import itertools
import json
import os
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, NamedTuple

from pipeline.artifacts.content.digest import (
    MODULES_KEY,
    EncodedParams,
    ParsedParams,
    TensorRecord,
    combine,
    dtype_code,
    itemsize,
    parse_params,
    sha256_hex,
)
from pipeline.artifacts.errors import ArtifactError

if TYPE_CHECKING:
    import torch

# Below this many bytes in all, starting threads costs more than hashing where we are.
_THREADED_HASH_BYTES = 4 << 20


class Download(NamedTuple):
    """An object being read: its buffer (the object's full size) and the progress of filling it.

    Iterating ``filled`` fills ``buffer`` and yields how many bytes from its start hold the
    object so far, ending at ``len(buffer)``; it raises if the object cannot be read whole.
    """

    buffer: memoryview
    filled: Iterator[int]


@dataclass(frozen=True)
class EncodedStream:
    """A params blob as buffers (``chunks``: the header, then one view per tensor)."""

    chunks: list[memoryview]
    modules: tuple[str, ...]
    metadata: dict[str, str]
    keys: list[str]
    """Tensor keys in file order, one per chunk after the header."""
    shapes: dict[str, tuple[str, tuple[int, ...]]]
    """Key -> (safetensors dtype code, shape)."""

    @property
    def size(self) -> int:
        return sum(chunk.nbytes for chunk in self.chunks)

    def encoded(self, digests: dict[str, str]) -> EncodedParams:
        """The params digest and records, given every tensor's sha256 (``TensorHashes``)."""
        tensors = {
            key: TensorRecord(dtype, shape, digests[key])
            for key, (dtype, shape) in self.shapes.items()
        }
        return EncodedParams(combine(self.metadata, tensors), self.modules, tensors)


def encode_params(modules: tuple[str, ...], flat: dict[str, torch.Tensor]) -> EncodedStream:
    """Lay flattened params (``digest.flatten_params``) out as a safetensors file, uncopied."""
    import torch

    if sys.byteorder != "little":
        raise ArtifactError("safetensors files are little-endian; this machine is big-endian")
    metadata = {"format": "pt", MODULES_KEY: json.dumps(list(modules))}
    shapes = {key: (dtype_code(t.dtype) or "", tuple(t.shape)) for key, t in flat.items()}
    keys = sorted(flat, key=lambda key: (-itemsize(shapes[key][0]), key))
    views = [memoryview(flat[key].reshape(-1).view(torch.uint8).numpy()) for key in keys]
    header: dict[str, object] = {"__metadata__": metadata}
    offsets = itertools.accumulate((view.nbytes for view in views), initial=0)
    for key, begin, view in zip(keys, offsets, views, strict=False):
        dtype, shape = shapes[key]
        span = [begin, begin + view.nbytes]
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": span}
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-len(text) % 8)  # tensors start 8-aligned, as safetensors writes them
    chunks = [memoryview(len(text).to_bytes(8, "little") + text), *views]
    return EncodedStream(chunks, modules, metadata, keys, shapes)


class TensorHashes:
    """sha256 of tensors on worker threads, started as each tensor's bytes are ready.

    ``beside_writer``: the caller's thread keeps a core busy writing meanwhile, so one
    core fewer hashes (on 2 cores, a second hashing thread slowed the write more than it
    sped the hash). Use as a context manager: leaving early (an error) drops the work
    not started.
    """

    def __init__(self, total_bytes: int, *, beside_writer: bool) -> None:
        cores = os.cpu_count() or 1
        workers = max(1, min(8, cores - 1 if beside_writer else cores))
        threaded = total_bytes >= _THREADED_HASH_BYTES
        self._pool = ThreadPoolExecutor(max_workers=workers) if threaded else None
        self._pending: dict[str, Future[str] | str] = {}

    def add(self, key: str, view: memoryview) -> None:
        if self._pool is None:
            self._pending[key] = sha256_hex(view)
        else:
            self._pending[key] = self._pool.submit(sha256_hex, view)

    def digests(self) -> dict[str, str]:
        """Every added tensor's digest, waiting for those still being hashed."""
        return {
            key: found if isinstance(found, str) else found.result()
            for key, found in self._pending.items()
        }

    def __enter__(self) -> TensorHashes:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def receive_params(
    download: Download, where: str
) -> tuple[ParsedParams, str, dict[str, TensorRecord]]:
    """Read a params blob whole, hashing each tensor once its bytes are in.

    Returns the parsed file, its params digest and per-tensor records. Header errors are
    those of ``digest.parse_params`` for the whole file (``where`` names it).
    """
    buffer = download.buffer
    parsed: ParsedParams | None = None
    waiting: list[str] = []
    filled_iter = download.filled
    with TensorHashes(len(buffer), beside_writer=False) as hashes:
        try:
            for filled in filled_iter:
                if parsed is None and _header_in(buffer, filled):
                    parsed = parse_params(buffer, where)
                    waiting = sorted(parsed.entries, key=lambda k: -parsed.entries[k].end)
                while parsed is not None and waiting and parsed.entries[waiting[-1]].end <= filled:
                    key = waiting.pop()
                    entry = parsed.entries[key]
                    hashes.add(key, buffer[entry.begin : entry.end])
        finally:
            if hasattr(filled_iter, "close"):
                filled_iter.close()
        if parsed is None:  # shorter than its header says: parse_params names what is wrong
            parsed = parse_params(buffer, where)
        digests = hashes.digests()
    tensors = {
        key: TensorRecord(entry.dtype, entry.shape, digests[key])
        for key, entry in parsed.entries.items()
    }
    return parsed, combine(parsed.metadata, tensors), tensors


def _header_in(buffer: memoryview, filled: int) -> bool:
    if filled == len(buffer):
        return True
    return filled >= 8 and filled >= 8 + int.from_bytes(buffer[:8], "little")


class ChunkReader(io.RawIOBase):
    """A read-only, seekable file over buffers, read without joining them first.

    The body of an S3 upload: boto reads it to sign and send it, and seeks back to retry.
    """

    def __init__(self, chunks: Sequence[memoryview]) -> None:
        super().__init__()
        self._chunks = list(chunks)
        self._starts = list(itertools.accumulate((c.nbytes for c in self._chunks), initial=0))
        self._position = 0

    @property
    def size(self) -> int:
        return self._starts[-1]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self.size}[whence]
        if base + offset < 0:
            raise ValueError(f"cannot seek to {base + offset}, before the start")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        target = memoryview(buffer).cast("B")
        index = bisect.bisect_right(self._starts, self._position) - 1
        written = 0
        while written < len(target) and index < len(self._chunks):
            chunk, offset = self._chunks[index], self._position - self._starts[index]
            count = min(chunk.nbytes - offset, len(target) - written)
            target[written : written + count] = chunk[offset : offset + count]
            written += count
            self._position += count
            index += 1
        return written

    def readall(self) -> bytes:
        # RawIOBase would gather the rest in small reads.
        rest = bytearray(max(0, self.size - self._position))
        return bytes(rest[: self.readinto(rest)])
