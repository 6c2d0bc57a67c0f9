"""Turn a dataset ``source`` (file, directory, glob, list; local path or URI) into files.

Only names are resolved here: nothing is opened. The result also fixes the dataset root,
the directory that holds ``dataset.json`` and against which file paths are made relative
for the fingerprint.
"""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Sequence
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from pipeline.contract.schema import DatasetError
from pipeline.io.s3 import SCHEME as S3_SCHEME
from pipeline.io.s3 import s3_error, s3_filesystem

METADATA_FILE = "dataset.json"
PARQUET_SUFFIX = ".parquet"
_GLOB_CHARS = frozenset("*?[")

Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]
"""A file, a directory (every ``*.parquet`` below it), a glob, or a list of these."""


@dataclass(frozen=True)
class ResolvedSource:
    """The Parquet files of one dataset and where its ``dataset.json`` would live."""

    files: tuple[str, ...]
    """Sorted paths on ``filesystem``."""
    root: str
    """Directory holding ``dataset.json``: the directory given, or the files' common one."""
    description: str
    """The source as the user wrote it, for messages."""
    whole_directory: bool
    """True when the source named one directory, so every file in it was selected."""
    filesystem: pafs.FileSystem = field(repr=False, compare=False)

    def relative(self, path: str) -> str:
        """``path`` relative to ``root``, in POSIX form."""
        return posixpath.relpath(path, self.root.rstrip("/") or "/")


def resolve_source(source: Source, filesystem: pafs.FileSystem | None = None) -> ResolvedSource:
    """Expand ``source`` into a sorted tuple of Parquet files on one filesystem.

    A directory selects every ``*.parquet`` file below it (hidden and ``_``-prefixed names
    are skipped, as Spark and Hive write them); a glob matches ``*``, ``?`` and ``[...]``
    within one path segment. Raises ``DatasetError`` when nothing matches.
    """
    entries = [source] if isinstance(source, str | os.PathLike) else list(source)
    if not entries:
        raise DatasetError("source is an empty list; expected at least one file, directory or glob")
    description = ", ".join(os.fspath(e) for e in entries)
    files: list[str] = []
    directories: list[str] = []
    fs = filesystem
    for entry in entries:
        entry_fs, path = _split_uri(os.fspath(entry), filesystem)
        if fs is None:
            fs = entry_fs
        elif fs.type_name != entry_fs.type_name:
            raise DatasetError(
                f"source {description!r} mixes filesystems ({fs.type_name} and "
                f"{entry_fs.type_name}); expected every entry on one filesystem"
            )
        try:
            found, is_directory = _expand(fs, path, os.fspath(entry))
        except OSError as exc:
            if fs.type_name != "s3":
                raise
            raise s3_error(os.fspath(entry), exc) from None
        files.extend(found)
        if is_directory:
            directories.append(path)
    assert fs is not None
    unique = tuple(sorted(set(files)))
    if not unique:
        raise DatasetError(
            f"no Parquet files found at {description!r}; expected *{PARQUET_SUFFIX} files "
            "(a file, a directory holding them, a glob, or a list of these)"
        )
    whole_directory = len(entries) == 1 and len(directories) == 1
    root = directories[0] if whole_directory else _common_directory(unique)
    _refuse_nested_datasets(fs, root, unique, description)
    return ResolvedSource(unique, root, description, whole_directory, fs)


def filesystem_for(uri: str | os.PathLike[str]) -> tuple[pafs.FileSystem, str]:
    """The filesystem that holds ``uri`` and the path of ``uri`` on it.

    ``s3://`` URIs get ``pipeline.io.s3`` (endpoint and keys from the standard AWS
    variables; the bucket checked), other URIs what ``pyarrow.fs`` makes of them, plain
    paths the local filesystem. Raises ``DatasetError`` naming ``uri``.
    """
    entry = os.fspath(uri)
    if entry.startswith(S3_SCHEME):
        return s3_filesystem(entry)
    if "://" in entry:
        try:
            return pafs.FileSystem.from_uri(entry)
        except Exception as exc:
            raise DatasetError(
                f"cannot open source {entry!r}: {exc}; expected a local path or a URI that "
                "pyarrow.fs understands (file://, s3://, gs://, hdfs://, ...)"
            ) from None
    return pafs.LocalFileSystem(), os.path.abspath(entry)


def uri_of(filesystem: pafs.FileSystem, path: str) -> str:
    """``path`` on ``filesystem`` as a user would write it: ``s3://bucket/key`` on S3."""
    return S3_SCHEME + path if filesystem.type_name == "s3" else path


def _split_uri(entry: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is not None:
        # With an explicit filesystem, paths are that filesystem's own (no scheme).
        path = entry.split("://", 1)[1] if "://" in entry else entry
        return filesystem, path.rstrip("/") or "/"
    return filesystem_for(entry)


def _expand(fs: pafs.FileSystem, path: str, entry: str) -> tuple[list[str], bool]:
    """Files named by one entry, and whether the entry was a directory."""
    if any(c in _GLOB_CHARS for c in path):
        return _glob(fs, path), False
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.File:
        return [path], False
    if info.type == pafs.FileType.Directory:
        return _parquet_files_below(fs, path), True
    raise DatasetError(
        f"source {entry!r} does not exist; expected a Parquet file, a directory or a glob"
    )


def _parquet_files_below(fs: pafs.FileSystem, directory: str) -> list[str]:
    selector = pafs.FileSelector(directory, recursive=True)
    return [
        info.path
        for info in fs.get_file_info(selector)
        if info.type == pafs.FileType.File
        and info.path.endswith(PARQUET_SUFFIX)
        and not _is_hidden(posixpath.relpath(info.path, directory))
    ]


def _glob(fs: pafs.FileSystem, pattern: str) -> list[str]:
    segments = pattern.split("/")
    first_glob = next(i for i, s in enumerate(segments) if any(c in _GLOB_CHARS for c in s))
    base = "/".join(segments[:first_glob]) or "/"
    if fs.get_file_info(base).type != pafs.FileType.Directory:
        return []
    matches = []
    for info in fs.get_file_info(pafs.FileSelector(base, recursive=True)):
        parts = info.path.split("/")
        if (
            info.type == pafs.FileType.File
            and len(parts) == len(segments)
            and all(fnmatch.fnmatchcase(p, s) for p, s in zip(parts, segments, strict=True))
        ):
            matches.append(info.path)
    return matches


def _is_hidden(relative_path: str) -> bool:
    return any(part.startswith((".", "_")) for part in relative_path.split("/"))


def _common_directory(files: Sequence[str]) -> str:
    return posixpath.commonpath([posixpath.dirname(f) for f in files])


def _refuse_nested_datasets(
    fs: pafs.FileSystem, root: str, files: Sequence[str], description: str
) -> None:
    """A directory whose subdirectories carry their own ``dataset.json`` holds several
    datasets (``train/`` and ``heldout/`` of a generator's output): reading them as one
    would mix held-out tasks into training, so ask for one of them."""
    subdirectories = {posixpath.dirname(f) for f in files} - {root}
    below = sorted(
        d
        for d in subdirectories
        if fs.get_file_info(posixpath.join(d, METADATA_FILE)).type == pafs.FileType.File
    )
    if below:
        names = ", ".join(posixpath.relpath(d, root) + "/" + METADATA_FILE for d in below)
        first = posixpath.join(description.rstrip("/"), posixpath.relpath(below[0], root))
        raise DatasetError(
            f"source {description!r} holds several datasets ({names}); expected one dataset: "
            f"point at one of them, e.g. {first!r}"
        )
