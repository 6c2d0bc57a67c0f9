"""``compact``: rows kept and sorted by (task_id, eps_id, t), files and row groups of the
asked sizes, dataset.json carried over with the source's fingerprint, the bounded-memory
sort equal to the in-memory one, and refusals that leave nothing behind; the CLI and the
``validate`` warning for many tiny files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import flows.cli
from pipeline.contract.dataset_json import DatasetMetadata, write_metadata
from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from pipeline.writes.compact import compact
from pipeline.writes.external_sort import sort_tables
from tests.helpers.episode_files import episode_table, fixed_list, write

KEYS = ["task_id", "eps_id", "t"]


@pytest.fixture(autouse=True)
def _only_data_commands(monkeypatch):
    monkeypatch.setattr(flows.cli, "_GROUPS", ("data",))


def _shuffled_dataset(directory: Path, files: int = 4, rows: int = 240) -> Path:
    """``files`` files of rows in a random order: 3 tasks, string episode ids, episodes of
    6 steps; ``rewards`` holds each row's index in the original order."""
    table = episode_table(
        rows,
        episode_length=6,
        tasks=("walk", "run", "jump"),
        eps_id=pa.array([f"ep-{e:03d}" for e in np.arange(rows) // 6]),
        rewards=pa.array(np.arange(rows, dtype=np.float32)),
    )
    table = table.take(np.random.default_rng(0).permutation(rows))
    for index, part in enumerate(np.array_split(np.arange(rows), files)):
        write(directory / f"chunk-{index}.parquet", table.take(part))
    tasks = {task: {"speed": i} for i, task in enumerate(("walk", "run", "jump"))}
    write_metadata(directory, DatasetMetadata(id="moves", split="train", tasks=tasks))
    return directory


def _read(directory: Path) -> pa.Table:
    tables = [pq.read_table(path) for path in sorted(directory.glob("*.parquet"))]
    return pa.concat_tables(tables)


def _keys(table: pa.Table) -> list[tuple]:
    columns = [table.column(k).to_pylist() for k in KEYS]
    return list(zip(*columns, strict=True))


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_compact_keeps_every_row_sorted_and_records_the_source(tmp_path):
    source = _shuffled_dataset(tmp_path / "src")
    before = inspect_episodes(source)

    info = compact(source, tmp_path / "out")

    out = tmp_path / "out"
    written = _read(out)
    original = _read(source)
    assert _keys(written) == sorted(_keys(original))
    by_reward = sorted(written.to_pylist(), key=lambda row: row["rewards"])
    assert by_reward == sorted(original.to_pylist(), key=lambda row: row["rewards"])
    assert info.root == str(out) and info.files == (str(out / "part-00000.parquet"),)
    assert info.summary() == inspect_episodes(out).summary()
    assert (info.num_rows, info.num_episodes, info.task_ids) == (
        before.num_rows,
        before.num_episodes,
        before.task_ids,
    )
    document = json.loads((out / "dataset.json").read_text())
    assert document["compacted_from"] == {"fingerprint": before.fingerprint, "files": 4}
    assert (document["id"], document["split"], document["tasks"]["run"]) == (
        "moves",
        "train",
        {"speed": 1},
    )
    assert (document["num_rows"], document["files"]) == (240, ["part-00000.parquet"])
    assert _leftovers(tmp_path) == ["out", "src"]


def test_file_and_row_group_sizes_follow_the_options(tmp_path):
    source = _shuffled_dataset(tmp_path / "src", rows=600)
    compact(source, tmp_path / "out", file_bytes=1, row_group_rows=100)
    files = sorted((tmp_path / "out").glob("*.parquet"))
    assert [f.name for f in files] == [f"part-{i:05d}.parquet" for i in range(6)]
    assert [pq.ParquetFile(f).metadata.num_rows for f in files] == [100] * 6

    compact(source, tmp_path / "two", file_bytes=1 << 30, row_group_rows=256)
    (single,) = (tmp_path / "two").glob("*.parquet")
    groups = pq.ParquetFile(single).metadata
    assert [groups.row_group(i).num_rows for i in range(groups.num_row_groups)] == [256, 256, 88]


def test_sorting_in_runs_on_disk_gives_the_in_memory_result(tmp_path):
    source = _shuffled_dataset(tmp_path / "src", files=7, rows=900)
    compact(source, tmp_path / "memory")
    compact(source, tmp_path / "runs", memory_bytes=4096, row_group_rows=50)

    assert _read(tmp_path / "runs").to_pylist() == _read(tmp_path / "memory").to_pylist()
    assert len(list((tmp_path / "runs").glob("*.parquet"))) == 1


def _numbered_tables(count: int, rows: int, seed: int) -> list[pa.Table]:
    """``count`` tables of ``rows`` rows: keys ``k`` in 0..4 (many ties), ``seq`` the input
    position."""
    rng = np.random.default_rng(seed)
    return [
        pa.table({"k": rng.integers(0, 5, rows), "seq": np.arange(i * rows, (i + 1) * rows)})
        for i in range(count)
    ]


def _assert_sorted_with_ties_in_input_order(merged: pa.Table, tables: list[pa.Table]) -> None:
    whole = pa.concat_tables(tables)
    expected = np.lexsort((whole.column("seq").to_numpy(), whole.column("k").to_numpy()))
    assert merged.column("seq").to_pylist() == whole.column("seq").to_numpy()[expected].tolist()


def test_external_sort_keeps_ties_in_input_order_across_runs(tmp_path):
    tables = _numbered_tables(8, 50, seed=1)
    merged = pa.concat_tables(sort_tables(tables, ["k"], run_bytes=1000, scratch=tmp_path))

    assert len(list(tmp_path.glob("run-*.arrow"))) > 1
    _assert_sorted_with_ties_in_input_order(merged, tables)


def test_external_sort_merges_many_runs_in_passes_keeping_ties_in_input_order(tmp_path):
    tables = _numbered_tables(150, 10, seed=2)
    merged = pa.concat_tables(sort_tables(tables, ["k"], run_bytes=1, scratch=tmp_path))

    # 150 runs are more than one merge takes (64): merged into 3 longer runs, inputs removed.
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"merged-1-{i:05d}.arrow" for i in range(3)
    ]
    _assert_sorted_with_ties_in_input_order(merged, tables)


@pytest.mark.parametrize("run_bytes", [1, 1 << 20], ids=["runs", "in-memory"])
def test_external_sort_unifies_schemas_and_fills_missing_columns_with_nulls(tmp_path, run_bytes):
    tables = [
        pa.table({"k": [3, 1], "x": pa.array([1, 2], pa.int32())}),
        pa.table({"k": [2, 0]}),
        pa.table({"k": [4], "x": pa.array([5], pa.int64())}),
    ]
    out = list(sort_tables(tables, ["k"], run_bytes=run_bytes, scratch=tmp_path))

    assert {table.schema for table in out} == {pa.schema({"k": pa.int64(), "x": pa.int64()})}
    assert pa.concat_tables(out).to_pydict() == {"k": [0, 1, 2, 3, 4], "x": [None, 2, None, 1, 5]}


def test_non_canonical_types_come_out_canonical(tmp_path):
    table = episode_table(
        12, obs=fixed_list(np.ones((12, 3))), t=pa.array(np.arange(12) % 3, pa.int64())
    )
    write(tmp_path / "src" / "a.parquet", table)

    compact(tmp_path / "src", tmp_path / "out")

    schema = pq.read_schema(tmp_path / "out" / "part-00000.parquet")
    assert schema.field("obs").type == pa.fixed_shape_tensor(pa.float32(), [3])
    assert schema.field("t").type == pa.int32()
    assert json.loads((tmp_path / "out" / "dataset.json").read_text())["id"] == "src"


def test_a_source_that_does_not_validate_is_refused_and_nothing_written(tmp_path):
    bad = episode_table(6, rewards=pa.array(np.zeros(6), pa.float64()))
    path = write(tmp_path / "src" / "a.parquet", bad)

    with pytest.raises(DatasetError) as refused:
        compact(tmp_path / "src", tmp_path / "out")

    assert str(refused.value) == (
        f"{path}: column 'rewards' has type float64; expected float32. Fix: cast with "
        "pyarrow.compute.cast(rewards, pyarrow.float32())"
    )
    assert _leftovers(tmp_path) == ["src"]


def test_a_failure_while_writing_leaves_nothing_behind(tmp_path):
    """A data page broken behind a valid footer, in a column outside the contract, passes
    validation (footers, id and value columns, bytes) and fails the rewrite half-way."""
    info = pa.array(np.arange(6, dtype=np.float64))
    path = write(tmp_path / "src" / "a.parquet", episode_table(6, info=info))
    metadata = pq.ParquetFile(path).metadata
    names = [metadata.schema.column(i).path for i in range(metadata.num_columns)]
    chunk = metadata.row_group(0).column(names.index("info"))
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    broken = bytearray(path.read_bytes())
    broken[start : start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    path.write_bytes(bytes(broken))
    assert inspect_episodes(tmp_path / "src").num_rows == 6

    with pytest.raises(DatasetError) as refused:
        compact(tmp_path / "src", tmp_path / "out")

    assert str(refused.value).startswith(f"{path}: cannot be read (")
    assert str(refused.value).endswith(
        "); expected readable Parquet data (validation reads footers and id columns "
        "only: was the file changed since, or is it corrupted?)"
    )
    assert _leftovers(tmp_path) == ["src"]


def test_an_existing_or_nested_output_is_refused(tmp_path):
    source = _shuffled_dataset(tmp_path / "src", rows=24)
    (tmp_path / "taken").mkdir()

    with pytest.raises(FileExistsError) as exists:
        compact(source, tmp_path / "taken")
    assert str(exists.value) == (
        f"{tmp_path / 'taken'}: already exists; expected a new directory (compact never "
        "overwrites: choose another --out, or remove it first)"
    )
    with pytest.raises(DatasetError) as nested:
        compact(source, source / "compacted")
    assert str(nested.value) == (
        f"{source / 'compacted'}: inside the source dataset {source}; expected an output "
        "directory outside it (its files would be read as part of the source from then on)"
    )
    assert _leftovers(tmp_path) == ["src", "taken"]
    assert _leftovers(source) == ["chunk-0.parquet", "chunk-1.parquet", "chunk-2.parquet",
                                  "chunk-3.parquet", "dataset.json"]  # fmt: skip


def test_cli_compact_prints_the_summary_or_the_problem(tmp_path, capsys):
    source = _shuffled_dataset(tmp_path / "src")
    out = tmp_path / "out"
    argv = ["data", "compact", str(source), "--out", str(out), "--row-group-rows", "100"]
    assert flows.cli.main(argv) == 0
    shown = capsys.readouterr()
    assert shown.err == ""
    assert shown.out.splitlines()[:4] == [
        f"{out}: OK",
        "  id                moves",
        "  split             train",
        f"  root              {out}",
    ]
    assert pq.ParquetFile(out / "part-00000.parquet").metadata.num_row_groups == 3

    assert flows.cli.main(argv) == 1
    assert capsys.readouterr().err == (
        f"offmeta data compact: {out}: already exists; expected a new directory (compact never "
        "overwrites: choose another --out, or remove it first)\n"
    )


def test_validate_warns_about_many_tiny_files_and_still_succeeds(tmp_path, capsys):
    table = episode_table(101, episode_length=1)
    for index in range(101):
        write(tmp_path / "tiny" / f"part-{index:05d}.parquet", table.slice(index, 1))
    write(tmp_path / "few" / "part-0.parquet", table)
    median = np.median([p.stat().st_size for p in (tmp_path / "tiny").iterdir()]) / 1024

    assert flows.cli.main(["data", "validate", str(tmp_path / "tiny"), "--json"]) == 0
    shown = capsys.readouterr()
    assert json.loads(shown.out)["files"] == 101
    assert shown.err == (
        f"offmeta data validate: warning: {tmp_path / 'tiny'}: 101 files with a median size "
        f"of {median:.1f} KiB; reading costs a file open per file whatever its size, so files "
        "under 1 MiB read slowly. Rewrite them into ~128 MiB sorted files with: offmeta data "
        f"compact {tmp_path / 'tiny'} --out NEW_DIRECTORY\n"
    )
    assert flows.cli.main(["data", "validate", str(tmp_path / "few")]) == 0
    assert capsys.readouterr().err == ""
