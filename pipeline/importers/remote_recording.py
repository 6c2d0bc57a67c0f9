"""Recordings in object storage (``s3://``, or any URI ``pyarrow.fs`` opens): import a copy.

The importers walk a recording in its recorders' natural order and read every file once
(``source_files``); on a local disk. A remote recording is copied first, file by file with
bounded memory, into a hidden temporary directory beside the output (where the importers
already spill their sort runs), imported from there and removed. Paths are relative to the
recording's root in the source fingerprint, so a copy fingerprints as the original, and
errors raised while importing name the ``s3://`` URI instead of the copy.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs

from pipeline.contract.schema import DatasetError
from pipeline.io.dataset_source import filesystem_for
from pipeline.io.s3 import s3_error


def is_remote(src: str | os.PathLike[str]) -> bool:
    """Whether ``src`` is a URI (other than a ``file://`` one) rather than a local path."""
    text = os.fspath(src)
    return "://" in text and not text.startswith("file://")


@contextlib.contextmanager
def local_copy(uri: str, beside: Path) -> Iterator[Path]:
    """A local copy of the file or directory at ``uri`` in a temporary directory in
    ``beside`` (created if missing), removed on exit; ``DatasetError`` raised inside, and
    any about reading ``uri``, name ``uri``."""
    filesystem, path = filesystem_for(uri)
    shown = uri.rstrip("/")
    try:
        found = filesystem.get_file_info(path).type
    except OSError as exc:
        raise _read_error(filesystem, uri, exc) from None
    if found == pafs.FileType.NotFound:
        raise DatasetError(f"{shown} does not exist; expected a recording directory")
    beside.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".offmeta-import-", dir=beside))
    copy = work / posixpath.basename(path)
    try:
        try:
            pafs.copy_files(
                path,
                str(copy),
                source_filesystem=filesystem,
                destination_filesystem=pafs.LocalFileSystem(),
            )
        except OSError as exc:
            raise _read_error(filesystem, uri, exc) from None
        try:
            yield copy
        except DatasetError as exc:
            raise DatasetError(str(exc).replace(str(copy), shown)) from None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _read_error(filesystem: pafs.FileSystem, uri: str, exc: OSError) -> DatasetError:
    if filesystem.type_name == "s3":
        return s3_error(uri, exc)
    return DatasetError(f"cannot read {uri!r}: {' '.join(str(exc).split())}")
