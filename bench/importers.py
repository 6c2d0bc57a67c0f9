"""Importer throughput: transitions per second of ``import_rllib`` and ``import_minari``
(arrow and parquet) on generated recordings, each against pyarrow reading the same source
files and writing their rows to one Parquet file, measured in the same run.

The recordings are made here with pyarrow in the tools' layouts (tests use real ones):

- RLlib: ``<env>/run-000000-00001/`` holds the first tenth of the transitions and
  ``run-000000-00002/`` all of them again plus the rest, as the recorder's never-emptied
  buffer writes them (so a tenth of the source rows are duplicates); files of 5,000 rows,
  ``obs``/``new_obs`` as Ray tensor columns (``large_list<float>`` with Ray's extension
  metadata), int32 actions, float64 rewards, null-typed ``agent_id``/``module_id``.
- Minari: one folder per episode of 200 steps with ``part-0.arrow`` or ``part-0.parquet``
  (201 rows: observations plus one padding row) and ``metadata.json``.

Each import and each baseline runs in a child process, which reports its time and peak RSS;
a fourth figure compares the RLlib import's peak RSS with that of a source a quarter the size
(bounded memory: the ratio stays near 1).

Run: ``.venv/bin/python bench/importers.py [TRANSITIONS]`` (default 1,000,000).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
OBS_FLOATS = 16
EPISODE_STEPS = 200
RLLIB_FILE_ROWS = 5_000
_RAY_TENSOR = {
    b"ARROW:extension:name": b"ray.data.arrow_tensor_v2",
    b"ARROW:extension:metadata": f"[{OBS_FLOATS}]".encode(),
}

_CHILD = """
import json, sys, time
from pathlib import Path
import pyarrow as pa, pyarrow.parquet as pq
from pipeline.importers import import_minari, import_rllib
kind, src, out = sys.argv[1:4]
start = time.perf_counter()
if kind == "baseline":
    suffix = sys.argv[4]
    files = sorted(p for p in Path(src).rglob("*" + suffix))
    if suffix == ".arrow":
        tables = [pa.ipc.open_file(f).read_all() for f in files]
    else:
        tables = [pq.ParquetFile(f).read() for f in files]
    table = pa.concat_tables(tables)
    # The importer's write: zstd, no dictionary pages for floats (they are never smaller).
    ids = [f.name for f in table.schema if not pa.types.is_floating(f.type)
           and not pa.types.is_nested(f.type) and not isinstance(f.type, pa.ExtensionType)]
    pq.write_table(table, out, row_group_size=65536, compression="zstd", use_dictionary=ids)
else:
    {"rllib": import_rllib, "minari": import_minari}[kind](src, out)
seconds = time.perf_counter() - start
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec from the forking parent.
status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
rss = int(status.split()[0]) * 1024
print(json.dumps({"seconds": seconds, "peak_rss_bytes": rss}))
"""


def _episodes(transitions: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Observation sequences (steps + 1 rows each) of episodes covering ``transitions``."""
    lengths = [EPISODE_STEPS] * (transitions // EPISODE_STEPS)
    if transitions % EPISODE_STEPS:
        lengths.append(transitions % EPISODE_STEPS)
    return [rng.normal(size=(n + 1, OBS_FLOATS)).astype(np.float32) for n in lengths]


def _ray_tensor(values: np.ndarray) -> pa.Array:
    offsets = pa.array(np.arange(0, values.size + 1, OBS_FLOATS, dtype=np.int64))
    return pa.LargeListArray.from_arrays(offsets, pa.array(values.reshape(-1)))


def _rllib_table(episodes: list[np.ndarray], rng: np.random.Generator) -> pa.Table:
    steps = [len(e) - 1 for e in episodes]
    total = sum(steps)
    last = np.zeros(total, dtype=bool)
    last[np.cumsum(steps) - 1] = True
    schema = pa.schema(
        [
            ("eps_id", pa.string()),
            ("agent_id", pa.null()),
            ("module_id", pa.null()),
            pa.field("obs", pa.large_list(pa.float32()), metadata=_RAY_TENSOR),
            ("actions", pa.int32()),
            ("rewards", pa.float64()),
            pa.field("new_obs", pa.large_list(pa.float32()), metadata=_RAY_TENSOR),
            ("terminateds", pa.bool_()),
            ("truncateds", pa.bool_()),
        ]
    )
    columns = [
        pa.array(np.repeat([f"{i:032x}" for i in range(len(episodes))], steps)),
        pa.nulls(total),
        pa.nulls(total),
        _ray_tensor(np.concatenate([e[:-1] for e in episodes])),
        pa.array(rng.integers(0, 2, total, dtype=np.int32)),
        pa.array(np.ones(total)),
        _ray_tensor(np.concatenate([e[1:] for e in episodes])),
        pa.array(last),
        pa.array(np.zeros(total, dtype=bool)),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def write_rllib(root: Path, transitions: int, rng: np.random.Generator) -> int:
    """The recorder's layout (see module doc); returns the number of source rows."""
    table = _rllib_table(_episodes(transitions, rng), rng)
    first = table.slice(0, transitions // 10)
    for number, rows in ((1, first), (2, table)):
        run = root / "cartpole" / f"run-000000-{number:05d}"
        run.mkdir(parents=True)
        for block, start in enumerate(range(0, rows.num_rows, RLLIB_FILE_ROWS)):
            part = rows.slice(start, RLLIB_FILE_ROWS)
            pq.write_table(part, run / f"bench_{block:06d}-0.parquet")
    return first.num_rows + table.num_rows


def write_minari(root: Path, transitions: int, rng: np.random.Generator, storage: str) -> int:
    """Minari's layout (see module doc); returns the number of source rows."""
    data = root / "data"
    data.mkdir(parents=True)
    episodes = _episodes(transitions, rng)
    metadata = {
        "data_format": storage,
        "dataset_id": "bench/random-v0",
        "observation_space": json.dumps({"type": "Box", "dtype": "float32", "shape": [OBS_FLOATS]}),
        "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 2}),
        "total_episodes": len(episodes),
        "total_steps": transitions,
    }
    (data / "metadata.json").write_text(json.dumps(metadata))
    for index, observations in enumerate(episodes):
        steps = len(observations) - 1
        ends = np.zeros(steps + 1, dtype=bool)
        ends[steps - 1] = True
        table = pa.table(
            {
                "observations": pa.FixedSizeListArray.from_arrays(
                    pa.array(observations.reshape(-1)), OBS_FLOATS
                ),
                "actions": pa.array(np.r_[rng.integers(0, 2, steps), 0]),
                "rewards": pa.array(np.r_[np.ones(steps), 0.0]),
                "terminations": pa.array(ends),
                "truncations": pa.array(np.zeros(steps + 1, dtype=bool)),
            }
        )
        episode = data / str(index)
        episode.mkdir()
        if storage == "parquet":
            pq.write_table(table, episode / "part-0.parquet")
        else:
            with pa.ipc.new_file(episode / "part-0.arrow", table.schema) as writer:
                writer.write_table(table)
        (episode / "metadata.json").write_text(json.dumps({"id": index, "total_steps": steps}))
    return sum(len(e) for e in episodes)


def _child(*args: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


def main(transitions: int) -> None:
    sys.path.insert(0, str(ROOT))
    from bench.records import Baseline, write_record

    rng = np.random.default_rng(0)
    formats = (
        ("1-rllib", "rllib", ".parquet", lambda root: write_rllib(root, transitions, rng)),
        (
            "2-minari-arrow",
            "minari",
            ".arrow",
            lambda root: write_minari(root, transitions, rng, "arrow"),
        ),
        (
            "3-minari-parquet",
            "minari",
            ".parquet",
            lambda root: write_minari(root, transitions, rng, "parquet"),
        ),
    )
    rllib_rss = 0
    for figure, kind, suffix, make in formats:
        with tempfile.TemporaryDirectory(prefix="offmeta-bench-import-") as tmp:
            source = Path(tmp) / "source"
            start = time.perf_counter()
            source_rows = make(source)
            generated = time.perf_counter() - start
            files = sum(1 for _ in source.rglob(f"*{suffix}"))
            size = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
            baseline = _child("baseline", str(source), str(Path(tmp) / "baseline.parquet"), suffix)
            imported = _child(kind, str(source), str(Path(tmp) / "imported"))
            rllib_rss = rllib_rss or imported["peak_rss_bytes"]
            rate = transitions / imported["seconds"]
            base_rate = transitions / baseline["seconds"]
            print(
                f"{figure}: {transitions} transitions from {source_rows} source rows in {files} "
                f"files ({size / 1e6:.0f} MB, generated in {generated:.1f} s): import "
                f"{imported['seconds']:.2f} s = {rate / 1e6:.3f} M rows/s, peak RSS "
                f"{_mib(imported)}; baseline read + write {baseline['seconds']:.2f} s = "
                f"{base_rate / 1e6:.3f} M rows/s, peak RSS {_mib(baseline)}; "
                f"ratio {rate / base_rate:.2f}"
            )
            write_record(
                "importers",
                figure,
                f"offmeta data import {kind} ({suffix[1:]} source), transitions/s",
                rate,
                "rows/s",
                baseline=Baseline(
                    "pyarrow: read every source file, concatenate, write one Parquet file, rows/s",
                    base_rate,
                ),
                shape=_shape(transitions, source_rows, files),
                details={
                    "import_seconds": imported["seconds"],
                    "baseline_seconds": baseline["seconds"],
                    "import_peak_rss_bytes": imported["peak_rss_bytes"],
                    "baseline_peak_rss_bytes": baseline["peak_rss_bytes"],
                    "source_megabytes": round(size / 1e6, 1),
                },
            )
    _record_memory_bound(transitions, rllib_rss, rng, write_record, Baseline)


def _record_memory_bound(transitions, rss, rng, write_record, baseline_type) -> None:
    """Peak RSS of the RLlib import (external sort) at ``transitions`` against a quarter of
    them: bounded memory keeps the ratio near 1 while the source grows 4x."""
    quarter = transitions // 4
    with tempfile.TemporaryDirectory(prefix="offmeta-bench-import-") as tmp:
        source_rows = write_rllib(Path(tmp) / "source", quarter, rng)
        small = _child("rllib", str(Path(tmp) / "source"), str(Path(tmp) / "imported"))
    print(
        f"4-rllib-peak-rss: import of {transitions} transitions {rss / 2**20:.0f} MiB, of "
        f"{quarter} {_mib(small)}; ratio {rss / small['peak_rss_bytes']:.2f}"
    )
    write_record(
        "importers",
        "4-rllib-peak-rss",
        f"offmeta data import rllib, peak RSS (VmHWM) at {transitions} transitions, bytes",
        float(rss),
        "bytes",
        baseline=baseline_type(
            f"the same import at {quarter} transitions, peak RSS, bytes",
            float(small["peak_rss_bytes"]),
        ),
        target="<= 1.3",
        shape={**_shape(transitions, 0, 0), "baseline_transitions": quarter},
        details={"baseline_source_rows": source_rows},
    )


def _shape(transitions: int, source_rows: int, files: int) -> dict[str, int]:
    shape = {"transitions": transitions, "obs_floats": OBS_FLOATS, "episode_steps": EPISODE_STEPS}
    if files:
        shape |= {"source_rows": source_rows, "files": files}
    return shape


def _mib(run: dict[str, float]) -> str:
    return f"{run['peak_rss_bytes'] / 2**20:.0f} MiB"


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
