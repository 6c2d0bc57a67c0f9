"""Import a Minari dataset (Minari 0.5; the arrow and parquet storages).

Minari keeps a dataset as ``<root>/<namespace>/<name>-v<N>/data/``: ``metadata.json``
(``data_format``, ``dataset_id``, the spaces serialized as JSON strings, ``total_steps``,
``total_episodes``) and, for the arrow and parquet formats, one folder per episode named
by its integer id, holding the episode's file(s) (``part-0.arrow`` or ``part-0.parquet``)
and its own ``metadata.json`` (``total_steps``). The hdf5 format keeps everything in
``main_data.hdf5``, which would need h5py: it is refused with a way out.

An episode of T steps is stored as T+1 rows: ``observations`` holds the reset observation
and the one after every step, every other column is padded with one row. The import keeps
T transitions (``minari_episodes``). Episode ids are the folder names (int64), ``t`` counts
steps, ``task_id`` is the ``task_id`` argument or the dataset id.

Memory: groups of about ``_GROUP_ROWS`` rows, or one episode when it is longer (Minari
itself holds a whole episode in memory to write it). Episodes are read in id order, so the
output is sorted without a sort.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract.dataset_json import DatasetMetadata, GeneratorInfo, Space
from pipeline.contract.schema import DatasetError
from pipeline.importers.minari.episodes import RawEpisode, canonical_episodes, check_columns
from pipeline.importers.output import ImportSummary, SourceFacts, check_output, import_summary
from pipeline.importers.recording_files import SourceFingerprint, natural_key
from pipeline.importers.remote_recording import is_remote, local_copy
from pipeline.writes.writer import DatasetWriter, Progress

GENERATOR = "offmeta data import minari"
_METADATA = "metadata.json"
_SUFFIX = {"arrow": ".arrow", "parquet": ".parquet"}
_GROUP_ROWS = 65_536
_PROGRESS_EVERY = 1000


def import_minari(
    src: str | Path,
    out: str | Path,
    *,
    task_id: str | None = None,
    progress: Progress | None = None,
) -> ImportSummary:
    """Convert the Minari dataset at ``src`` (the dataset directory or its ``data/``) into a
    canonical dataset at ``out``.

    Raises ``DatasetError`` for input that cannot be converted and ``ValueError`` when
    ``out`` already holds files; nothing is written then. An ``s3://`` (or other remote)
    ``src`` is imported from a temporary local copy (``remote_source``).
    """
    if is_remote(src):
        check_output(Path(out).absolute())
        with local_copy(str(src), Path(out).absolute().parent) as copy:
            return _import(copy, str(src), Path(out).absolute(), task_id, progress)
    return _import(Path(src).absolute(), str(src), Path(out).absolute(), task_id, progress)


def _import(
    src: Path, given: str, out: Path, task_id: str | None, progress: Progress | None
) -> ImportSummary:
    data = _data_directory(src)
    fingerprint = SourceFingerprint(data)
    metadata = _read_json(data / _METADATA, fingerprint)
    data_format = metadata.get("data_format")
    if data_format == "hdf5":
        raise DatasetError(
            f"{data / _METADATA}: data_format is 'hdf5' (main_data.hdf5); expected 'arrow' or "
            "'parquet': reading HDF5 needs h5py, which offmeta does not depend on. Re-save the "
            "dataset with Minari in another format, e.g. minari.create_dataset_from_buffers("
            "..., data_format='arrow') over the episodes of minari.load_dataset(...)"
        )
    if data_format not in _SUFFIX:
        raise DatasetError(
            f"{data / _METADATA}: data_format is {data_format!r}; expected 'arrow' or 'parquet'"
        )
    spaces = {k: _space(metadata, k, data) for k in ("observation_space", "action_space")}
    task = task_id or str(metadata.get("dataset_id") or data.parent.name)
    check_output(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    reader = _Episodes(data, data_format, spaces, task, fingerprint)
    episodes = reader.tables(progress)
    first = next(episodes, None)
    if first is None:
        raise DatasetError(
            f"{data}: no episode folders with steps; expected one folder per episode, named "
            "by its integer id"
        )
    with DatasetWriter(out, purpose="importing", progress=progress) as writer:
        writer.write(first)
        for table in episodes:
            writer.write(table)
        reader.check_totals(metadata)
        writer.finish(_dataset_metadata(metadata, spaces, given, task, fingerprint.hexdigest()))
        return import_summary(
            writer.publish(),
            SourceFacts(
                source_rows=reader.rows + reader.padding_rows,
                duplicate_rows=0,
                padding_rows=reader.padding_rows,
                source_fingerprint=fingerprint.hexdigest(),
            ),
        )


class _Episodes:
    """Reads episode folders in id order and hands out canonical episode tables."""

    def __init__(
        self,
        data: Path,
        data_format: str,
        spaces: dict[str, dict[str, Any]],
        task: str,
        fingerprint: SourceFingerprint,
    ) -> None:
        self._data, self._format, self._spaces = data, data_format, spaces
        self._task, self._fingerprint = task, fingerprint
        self._schema: pa.Schema | None = None
        self.episodes = 0
        self.rows = 0
        self.padding_rows = 0

    def tables(self, progress: Progress | None) -> Iterator[pa.Table]:
        """Canonical tables of consecutive episodes, about ``_GROUP_ROWS`` rows each."""
        group: list[RawEpisode] = []
        rows = 0
        for directory in self._episode_directories():
            raw = self._read_episode(directory)
            self.episodes += 1
            self.padding_rows += min(raw.num_rows, 1)
            if raw.num_rows > 1:
                group.append(RawEpisode(int(directory.name), directory, raw))
                rows += raw.num_rows
            if rows >= _GROUP_ROWS:
                yield self._convert(group)
                group, rows = [], 0
            if progress is not None and self.episodes % _PROGRESS_EVERY == 0:
                progress(f"minari: read {self.episodes} episodes, {self.rows} steps")
        if group:
            yield self._convert(group)

    def _convert(self, group: list[RawEpisode]) -> pa.Table:
        table = canonical_episodes(group, self._spaces, self._task)
        self.rows += table.num_rows
        return table

    def check_totals(self, metadata: dict[str, Any]) -> None:
        """The dataset's ``metadata.json`` counts must match the episode folders."""
        for key, found in (("total_episodes", self.episodes), ("total_steps", self.rows)):
            if key in metadata and metadata[key] != found:
                raise DatasetError(
                    f"{self._data / _METADATA}: {key} is {metadata[key]} but the episode folders "
                    f"hold {found}; expected them to agree (is the dataset incomplete?)"
                )

    def _episode_directories(self) -> list[Path]:
        with os.scandir(self._data) as listing:
            folders = [e for e in listing if e.is_dir() and not e.name.startswith(".")]
        named = [e for e in folders if not e.name.isdigit()]
        if named:
            raise DatasetError(
                f"{named[0].path}: not an episode folder; expected the folders of {self._data} "
                "to be named by their integer episode id, as Minari writes them"
            )
        return [Path(e.path) for e in sorted(folders, key=lambda e: int(e.name))]

    def _read_episode(self, directory: Path) -> pa.Table:
        folder = os.fspath(directory)  # strings: per-episode pathlib work was a tenth of the time
        tables = [self._read_file(path) for path in self._episode_files(folder)]
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
        if self._schema is None:
            check_columns(table, directory)
            self._schema = table.schema
        elif not table.schema.equals(self._schema):
            raise DatasetError(
                f"{directory}: columns {_describe(table.schema)} differ from the first "
                f"episode's {_describe(self._schema)}; expected one type per column"
            )
        episode_metadata = os.path.join(folder, _METADATA)
        if os.path.isfile(episode_metadata):
            steps = _read_json(episode_metadata, self._fingerprint).get("total_steps")
            if steps is not None and steps + 1 != table.num_rows:
                raise DatasetError(
                    f"{directory}: {table.num_rows} rows but its metadata.json says total_steps "
                    f"{steps}; expected total_steps + 1 rows (observations include the reset)"
                )
        return table

    def _episode_files(self, folder: str) -> list[str]:
        """``part-0``, ``part-1``, ... as pyarrow's ``write_dataset`` names them: found by
        name (a listing per episode folder costs more than the episode's read), by listing
        when the folder holds other names."""
        suffix = _SUFFIX[self._format]
        files: list[str] = []
        while os.path.isfile(path := os.path.join(folder, f"part-{len(files)}{suffix}")):
            files.append(path)
        if not files:
            names = sorted((n for n in os.listdir(folder) if n.endswith(suffix)), key=natural_key)
            files = [os.path.join(folder, n) for n in names]
        if not files:
            raise DatasetError(
                f"{folder}: no *{suffix} file; expected the episode's data as Minari's "
                f"{self._format} storage writes it (part-0{suffix})"
            )
        return files

    def _read_file(self, path: str) -> pa.Table:
        source = self._fingerprint.read(path)
        try:
            if self._format == "parquet":
                return pq.ParquetFile(
                    source if isinstance(source, Path) else pa.BufferReader(source)
                ).read()
            with pa.ipc.open_file(
                pa.memory_map(str(source)) if isinstance(source, Path) else source
            ) as ipc:
                return ipc.read_all()
        except (pa.ArrowInvalid, OSError) as exc:
            raise DatasetError(
                f"{path}: not readable as {self._format} ({' '.join(str(exc).split())}); "
                f"expected Minari's {self._format} episode file"
            ) from None


def _describe(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name}: {f.type}" for f in schema)


def _data_directory(src: Path) -> Path:
    for candidate in (src, src / "data"):
        if (candidate / _METADATA).is_file():
            return candidate
    raise DatasetError(
        f"{src}: no Minari {_METADATA} in it or in {src / 'data'}; expected a Minari dataset "
        "directory (<datasets root>/<namespace>/<name>-v<N>, as minari.DataCollector."
        "create_dataset writes it) or its data/ folder"
    )


def _read_json(path: str | Path, fingerprint: SourceFingerprint) -> dict[str, Any]:
    try:
        document = json.loads(bytes(fingerprint.read(path)))  # type: ignore[arg-type]
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{path}: not valid JSON ({exc}); expected Minari's metadata") from None
    if not isinstance(document, dict):
        raise DatasetError(f"{path}: holds {type(document).__name__}; expected a JSON object")
    return document


def _space(metadata: dict[str, Any], key: str, data: Path) -> dict[str, Any]:
    """A serialized Gymnasium space from Minari's metadata (a JSON string or object)."""
    raw = metadata.get(key)
    try:
        space = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        space = None
    if not isinstance(space, dict) or space.get("type") not in ("Box", "Discrete"):
        found = space.get("type") if isinstance(space, dict) else raw
        raise DatasetError(
            f"{data / _METADATA}: {key} is {found!r}; expected a Box or Discrete space "
            "(flatten Dict/Tuple observations, e.g. with gymnasium's FlattenObservation "
            "wrapper, before recording)"
        )
    return space


def _offmeta_space(space: dict[str, Any]) -> Space:
    if space["type"] == "Discrete":
        n = space.get("n") if space.get("start", 0) == 0 else None
        return Space(kind="discrete", n=n)
    return Space(kind="box", shape=tuple(space["shape"]), **_uniform_bounds(space))


def _uniform_bounds(space: dict[str, Any]) -> dict[str, float]:
    """``low``/``high`` when every component shares one finite bound (``Space`` holds one
    number per bound; per-component bounds such as CartPole's are left out)."""
    bounds = {}
    for key in ("low", "high"):
        values = np.asarray(space.get(key, []), dtype=np.float64).ravel()
        if values.size and np.all(values == values[0]) and np.isfinite(values[0]):
            bounds[key] = float(values[0])
    return bounds


def _dataset_metadata(
    metadata: dict[str, Any],
    spaces: dict[str, dict[str, Any]],
    source: str,
    task: str,
    source_fingerprint: str,
) -> DatasetMetadata:
    dataset_id = str(metadata.get("dataset_id") or task)
    return DatasetMetadata(
        id=dataset_id,
        description=str(metadata.get("description") or f"Minari dataset {dataset_id}"),
        observation_space=_offmeta_space(spaces["observation_space"]),
        action_space=_offmeta_space(spaces["action_space"]),
        generator=GeneratorInfo(
            name=GENERATOR,
            args={
                "source": source,
                "source_fingerprint": source_fingerprint,
                "task_id": task,
                "data_format": metadata.get("data_format"),
                "minari_version": metadata.get("minari_version"),
            },
        ),
    )
