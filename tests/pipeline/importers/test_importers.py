"""Importers on the committed real-tool samples (RLlib 2.60's recorder, Minari 0.5.4's
DataCollector: see data/samples/*/README.md), compared with the raw files read by pyarrow.
Neither RLlib nor Minari is needed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import flows.cli
from pipeline.contract.dataset_json import DatasetMetadata
from pipeline.contract.schema import DatasetError
from pipeline.importers import import_minari, import_rllib
from pipeline.importers.recording_files import natural_key
from pipeline.importers.rllib.repeats import ORIGIN, SORT_KEYS, RepeatedSteps
from pipeline.reads.episodes import inspect_episodes
from pipeline.writes.external_sort import sort_tables
from pipeline.writes.writer import DatasetWriter
from tests.helpers.episode_files import episode_table
from tests.helpers.paths import REPO

REPO = REPO
SAMPLES = REPO / "data" / "samples"
RLLIB = SAMPLES / "rllib_cartpole" / "recording"
RLLIB_MA = SAMPLES / "rllib_multiagent_cartpole" / "recording"
MINARI = SAMPLES / "minari_cartpole"
RLLIB_VALUES = ("obs", "new_obs", "actions", "rewards", "terminateds", "truncateds")


def _natural(paths) -> list[Path]:
    return sorted(paths, key=lambda p: natural_key(p.name))


def _runs(recording: Path) -> list[Path]:
    return _natural(recording.glob("*/run-*"))


def _files(directory: Path, suffix: str = ".parquet") -> list[Path]:
    return _natural(directory.glob(f"*{suffix}"))


def _raw_run(run: Path) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in _files(run)])


def _dataset(directory: Path) -> pa.Table:
    files = json.loads((directory / "dataset.json").read_text())["files"]
    return pa.concat_tables([pq.read_table(directory / f) for f in files])


def _values(column: pa.ChunkedArray) -> np.ndarray:
    """Numbers of a column, tensors (Ray's or Arrow's) as ``[rows, elements]``."""
    array = column.combine_chunks()
    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if pa.types.is_list(array.type) or pa.types.is_large_list(array.type):
        return array.flatten().to_numpy().reshape(len(array), -1)
    if pa.types.is_fixed_size_list(array.type):
        return array.flatten().to_numpy().reshape(len(array), array.type.list_size)
    return array.to_numpy(zero_copy_only=False)


def _episode(table: pa.Table, eps_id: object) -> pa.Table:
    return table.filter(pc.equal(table.column("eps_id"), eps_id))


def _assert_rllib_steps_equal(out: pa.Table, raw: pa.Table, columns: tuple[str, ...]) -> None:
    """Each episode of ``raw`` (recorder rows in file order) is ``out``'s episode, t = 0.."""
    for eps_id in dict.fromkeys(raw.column("eps_id").to_pylist()):
        source, imported = _episode(raw, eps_id), _episode(out, eps_id)
        assert imported.column("t").to_pylist() == list(range(source.num_rows))
        for name in columns:
            expected = _values(source.column(name))
            if name == "rewards":
                expected = expected.astype(np.float32)  # the contract's type
            np.testing.assert_array_equal(_values(imported.column(name)), expected, err_msg=name)
        obs, new_obs = _values(imported.column("obs")), _values(imported.column("new_obs"))
        np.testing.assert_array_equal(obs[1:], new_obs[:-1])  # step order: a chain


def _assert_sorted(out: pa.Table) -> None:
    keys = list(zip(*(out.column(k).to_pylist() for k in ("task_id", "eps_id", "t")), strict=True))
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def _distinct_rows(recording: Path) -> int:
    """Distinct recorded rows, all files, however often the recorder wrote them."""
    rows = set()
    for run in _runs(recording):
        raw = _raw_run(run)
        columns = [_values(raw.column(n)) for n in RLLIB_VALUES]
        for i, eps_id in enumerate(raw.column("eps_id").to_pylist()):
            rows.add((eps_id, *(c[i].tobytes() for c in columns)))
    return len(rows)


def test_rllib_sample_keeps_each_step_once_in_recording_order(tmp_path):
    summary = import_rllib(RLLIB, tmp_path / "out")

    assert (summary.source_rows, summary.rows, summary.duplicate_rows) == (192, 128, 64)
    assert summary.rows == _distinct_rows(RLLIB)
    assert (summary.episodes, summary.tasks, summary.modules) == (
        7,
        ("cartpoleenv",),
        ("default_policy",),
    )
    assert inspect_episodes(tmp_path / "out").fingerprint == summary.fingerprint
    out = _dataset(tmp_path / "out")
    assert out.schema.names == [
        *("eps_id", "t", "obs", "actions", "rewards", "terminateds", "truncateds", "new_obs"),
        *("task_id", "action_dist_inputs", "action_logp", "weights_seq_no"),
    ]  # agent_id and module_id (type null) dropped
    tensor = pa.fixed_shape_tensor(pa.float32(), [4])
    assert [out.schema.field(n).type for n in ("t", "obs", "actions", "rewards", "new_obs")] == [
        pa.int32(),
        tensor,
        pa.int64(),
        pa.float32(),
        tensor,
    ]
    _assert_sorted(out)
    # The recorder never empties its buffer: its last write holds every step, in order.
    last = _raw_run(_runs(RLLIB)[-1])
    assert last.num_rows == out.num_rows
    _assert_rllib_steps_equal(out, last, (*RLLIB_VALUES, "action_dist_inputs", "action_logp"))
    metadata = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert metadata["generator"] == {
        "name": "offmeta data import rllib",
        "args": {
            "source": str(RLLIB),
            "source_fingerprint": summary.source_fingerprint,
            "task_id": None,
        },
    }
    assert metadata["observation_space"] == {"kind": "box", "shape": [4]}
    assert metadata["action_space"] == {"kind": "discrete", "shape": []}


def test_rllib_multi_agent_sample_fills_module_ids(tmp_path):
    summary = import_rllib(RLLIB_MA, tmp_path / "out", task_id="two-carts")

    assert (summary.source_rows, summary.rows, summary.episodes) == (166, 108, 8)
    assert summary.rows == _distinct_rows(RLLIB_MA)
    assert (summary.tasks, summary.modules) == (("two-carts",), ("p0", "p1"))
    out = _dataset(tmp_path / "out")
    assert out.schema.field("module_id").type == pa.dictionary(pa.int32(), pa.string())
    _assert_sorted(out)
    last = _raw_run(_runs(RLLIB_MA)[-1])
    _assert_rllib_steps_equal(out, last, (*RLLIB_VALUES, "agent_id"))
    for eps_id in dict.fromkeys(last.column("eps_id").to_pylist()):
        modules = _episode(out, eps_id).column("module_id").to_pylist()
        assert modules == _episode(last, eps_id).column("module_id").to_pylist()


def test_rllib_reads_ray_tensors_without_importing_ray(tmp_path):
    script = (
        "import sys\n"
        "from pipeline.importers import import_rllib\n"
        f"summary = import_rllib({str(RLLIB)!r}, {str(tmp_path / 'out')!r})\n"
        "print(summary.rows, any(m == 'ray' or m.startswith('ray.') for m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["128", "False"]


def test_rllib_reads_ray_tensors_with_ray_types_registered(tmp_path):
    import ray.data  # noqa: F401  (registers ArrowTensorTypeV2: pyarrow then reads it as such)

    assert isinstance(
        pq.read_schema(_files(_runs(RLLIB)[0])[0]).field("obs").type, pa.ExtensionType
    )
    import_rllib(RLLIB, tmp_path / "with-ray")
    import_rllib(RLLIB, tmp_path / "again")
    assert _dataset(tmp_path / "with-ray").equals(_dataset(tmp_path / "again"))
    assert _dataset(tmp_path / "with-ray").num_rows == 128


def test_rllib_refuses_a_step_recorded_twice_with_different_values(tmp_path):
    source = tmp_path / "recording"
    shutil.copytree(RLLIB, source)
    first_run, second_run = _runs(source)
    original, rewritten = _files(first_run)[0], _files(second_run)[0]
    table = pq.read_table(rewritten)
    eps_id = table.column("eps_id")[0].as_py()
    rewards = table.schema.get_field_index("rewards")
    pq.write_table(table.set_column(rewards, "rewards", pa.array([5.0])), rewritten)

    with pytest.raises(DatasetError) as refused:
        import_rllib(source, tmp_path / "out")
    assert str(refused.value) == (
        f"{rewritten}: episode '{eps_id}' step 0 is recorded twice with different values in "
        f"column 'rewards' (first in {original}); expected a repeated step to be an exact copy, "
        "as RLlib's recorder rewrites it (remove one of the two recordings)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["recording"]  # nothing written or left


def _rewrite_as_writes(tmp_path: Path, writes: list[list[Path]]) -> Path:
    """A recording whose ``run-000000-0000<i>`` holds copies of ``writes[i - 1]``."""
    recording = tmp_path / "recording" / "cartpoleenv"
    for number, files in enumerate(writes, start=1):
        run = recording / f"run-000000-{number:05d}"
        run.mkdir(parents=True)
        for path in files:
            shutil.copy(path, run / path.name)
    return recording.parent


def test_rllib_continues_an_episode_cut_between_writes(tmp_path):
    # output_max_rows_per_file: each write holds new rows only, an episode may straddle two.
    files = _files(_runs(RLLIB)[-1])
    cut = 30
    first_ids = set(_raw_run_of(files[:cut]).column("eps_id").to_pylist())
    assert first_ids & set(_raw_run_of(files[cut:]).column("eps_id").to_pylist())
    source = _rewrite_as_writes(tmp_path, [files[:cut], files[cut:]])

    summary = import_rllib(source, tmp_path / "out")
    import_rllib(RLLIB, tmp_path / "original")
    assert (summary.rows, summary.duplicate_rows) == (128, 0)
    assert _dataset(tmp_path / "out").equals(_dataset(tmp_path / "original"))


def _raw_run_of(files: list[Path]) -> pa.Table:
    return pa.concat_tables([pq.read_table(f) for f in files])


def test_rllib_refuses_a_write_that_neither_repeats_nor_continues_an_episode(tmp_path):
    files = _files(_runs(RLLIB)[-1])
    raw = _raw_run_of(files)
    eps_id = raw.column("eps_id")[0].as_py()
    steps = [f for f, e in zip(files, raw.column("eps_id").to_pylist(), strict=True) if e == eps_id]
    source = _rewrite_as_writes(tmp_path, [steps[:6], steps[8:9]])
    where = source / "cartpoleenv" / "run-000000-00002" / steps[8].name

    with pytest.raises(DatasetError) as refused:
        import_rllib(source, tmp_path / "out")
    assert str(refused.value) == (
        f"{where}: episode '{eps_id}' appears again, but its first row here neither repeats the "
        "episode's step 0 nor continues its step 5 (its obs is not that step's new_obs); "
        "expected RLlib's recorder to rewrite an episode from its first step or to continue it "
        "(are two recordings mixed under one eps_id?)"
    )


def test_rllib_refuses_compressed_observations(tmp_path):
    path = tmp_path / "recording" / "cartpole-v1" / "run-000000-00001" / "part-0.parquet"
    path.parent.mkdir(parents=True)
    raw = _raw_run_of(_files(_runs(RLLIB)[0])[:1])
    obs = raw.schema.get_field_index("obs")
    pq.write_table(raw.set_column(obs, "obs", pa.array([b"\x04\x22lz4"], pa.binary())), path)

    with pytest.raises(DatasetError) as refused:
        import_rllib(path.parents[2], tmp_path / "out")
    assert str(refused.value) == (
        f"{path}: column 'obs' holds binary values (RLlib's compressed columns); expected "
        "tensors: record with config.offline_data(output_compress_columns=[]) so that "
        "observations are stored uncompressed"
    )


def test_rllib_many_runs_merge_in_several_passes_to_the_same_dataset(tmp_path):
    # chunk_bytes=1: one sorted run per file, 192 runs > 64 merged at once: two passes.
    import_rllib(RLLIB, tmp_path / "small-chunks", chunk_bytes=1)
    import_rllib(RLLIB, tmp_path / "one-chunk")
    assert _dataset(tmp_path / "small-chunks").equals(_dataset(tmp_path / "one-chunk"))


def test_external_sort_merges_runs_and_drops_exact_repeats(tmp_path):
    rng = np.random.default_rng(0)
    table = episode_table(300, episode_length=7, tasks=("b", "a"), action_dim=None)
    table = table.set_column(7, "task_id", table.column("task_id").cast(pa.string()))
    repeated = pa.concat_tables([table, table.take(rng.choice(300, 120))])
    shuffled = repeated.take(rng.permutation(repeated.num_rows))
    shuffled = shuffled.append_column(ORIGIN, pa.array(np.arange(shuffled.num_rows)))

    repeats = RepeatedSteps(_never_conflicts)
    chunks = (shuffled.slice(start, 5) for start in range(0, shuffled.num_rows, 5))
    # 84 runs, merged 64 at a time: two passes.
    ordered = sort_tables(chunks, SORT_KEYS, run_bytes=1, scratch=tmp_path)
    merged = pa.concat_tables(repeats.unique(ordered))
    keys = [(k, "ascending") for k in ("task_id", "eps_id", "t")]
    expected = table.take(pc.sort_indices(table, keys))
    assert merged.drop_columns([ORIGIN]).equals(expected)
    assert repeats.dropped == 120


def _never_conflicts(table, first, second, column):
    raise AssertionError(f"rows {first} and {second} differ in {column}")


def test_writer_cuts_row_groups_and_files(tmp_path):
    table = episode_table(1000, episode_length=10, tasks=("a",))
    with DatasetWriter(
        tmp_path / "out", purpose="test", row_group_rows=128, file_bytes=20_000
    ) as w:
        for start in range(0, 1000, 300):
            w.write(table.slice(start, 300))
        w.finish(DatasetMetadata(id="x"))
        summary = w.publish()
    files = [
        pq.ParquetFile(tmp_path / "out" / f)
        for f in json.loads((tmp_path / "out" / "dataset.json").read_text())["files"]
    ]
    groups = [f.metadata.row_group(i).num_rows for f in files for i in range(f.num_row_groups)]
    assert groups == [128] * 7 + [104]
    assert 1 < len(files) < 8 and summary.num_rows == 1000 and len(summary.files) == len(files)
    assert _dataset(tmp_path / "out").equals(table.combine_chunks())


def test_import_refuses_a_used_output_directory_before_reading(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    with pytest.raises(ValueError) as refused:
        import_rllib(RLLIB, tmp_path / "out")
    assert str(refused.value) == (
        f"{tmp_path / 'out'} already exists and is not an empty directory; expected a new or "
        "empty directory for the imported dataset (delete it or choose another --out)"
    )
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize("storage", ["arrow", "parquet"])
def test_minari_sample_drops_padding_and_builds_new_obs(tmp_path, storage):
    summary = import_minari(MINARI / storage, tmp_path / "out")

    assert (summary.source_rows, summary.rows, summary.padding_rows) == (328, 316, 12)
    assert (summary.episodes, summary.tasks) == (12, ("cartpole/random-v0",))
    inspect_episodes(tmp_path / "out")
    out = _dataset(tmp_path / "out")
    assert out.column("eps_id").to_pylist() == sorted(out.column("eps_id").to_pylist())
    assert out.schema.field("eps_id").type == pa.int64()
    for episode in _natural((MINARI / storage / "data").iterdir()):
        if not episode.is_dir():
            continue
        (path,) = _files(episode, f".{storage}")
        raw = pq.read_table(path) if storage == "parquet" else pa.ipc.open_file(path).read_all()
        steps = json.loads((episode / "metadata.json").read_text())["total_steps"]
        imported = _episode(out, int(episode.name))
        assert raw.num_rows == steps + 1 and imported.num_rows == steps  # padding row dropped
        assert imported.column("t").to_pylist() == list(range(steps))
        observations = _values(raw.column("observations"))
        np.testing.assert_array_equal(_values(imported.column("obs")), observations[:-1])
        np.testing.assert_array_equal(_values(imported.column("new_obs")), observations[1:])
        for source, name in [
            ("actions", "actions"),
            ("terminations", "terminateds"),
            ("truncations", "truncateds"),
        ]:
            assert imported.column(name).to_pylist() == raw.column(source).to_pylist()[:-1]
        np.testing.assert_array_equal(
            _values(imported.column("rewards")),
            _values(raw.column("rewards"))[:-1].astype(np.float32),
        )
    metadata = json.loads((tmp_path / "out" / "dataset.json").read_text())
    assert metadata["id"] == "cartpole/random-v0"
    assert metadata["observation_space"] == {"kind": "box", "shape": [4]}  # per-component bounds
    assert metadata["action_space"] == {"kind": "discrete", "shape": [], "n": 2}
    assert metadata["generator"]["name"] == "offmeta data import minari"
    assert metadata["generator"]["args"]["source_fingerprint"] == summary.source_fingerprint


def test_minari_arrow_and_parquet_give_the_same_rows(tmp_path):
    import_minari(MINARI / "arrow" / "data", tmp_path / "arrow", task_id="cartpole")
    import_minari(MINARI / "parquet", tmp_path / "parquet", task_id="cartpole")
    assert _dataset(tmp_path / "arrow").equals(_dataset(tmp_path / "parquet"))
    assert set(_dataset(tmp_path / "arrow").column("task_id").to_pylist()) == {"cartpole"}


def test_minari_refuses_hdf5_with_a_way_out(tmp_path):
    with pytest.raises(DatasetError) as refused:
        import_minari(MINARI / "hdf5", tmp_path / "out")
    assert str(refused.value) == (
        f"{MINARI / 'hdf5' / 'data' / 'metadata.json'}: data_format is 'hdf5' (main_data.hdf5); "
        "expected 'arrow' or 'parquet': reading HDF5 needs h5py, which offmeta does not depend "
        "on. Re-save the dataset with Minari in another format, e.g. "
        "minari.create_dataset_from_buffers(..., data_format='arrow') over the episodes of "
        "minari.load_dataset(...)"
    )
    assert list(tmp_path.iterdir()) == []


def test_minari_refuses_a_dataset_missing_episodes(tmp_path):
    shutil.copytree(MINARI / "arrow", tmp_path / "source")
    shutil.rmtree(tmp_path / "source" / "data" / "11")
    with pytest.raises(DatasetError) as refused:
        import_minari(tmp_path / "source", tmp_path / "out")
    assert str(refused.value) == (
        f"{tmp_path / 'source' / 'data' / 'metadata.json'}: total_episodes is 12 but the episode "
        "folders hold 11; expected them to agree (is the dataset incomplete?)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["source"]


def test_minari_refuses_an_episode_that_ends_before_its_last_step(tmp_path):
    shutil.copytree(MINARI / "arrow", tmp_path / "source")
    path = tmp_path / "source" / "data" / "3" / "part-0.arrow"
    raw = pa.ipc.open_file(path).read_all()
    flags = raw.column("terminations").to_pylist()
    flags[2] = True
    raw = raw.set_column(
        raw.schema.get_field_index("terminations"), "terminations", pa.array(flags)
    )
    with pa.ipc.new_file(path, raw.schema) as writer:
        writer.write_table(raw)
    with pytest.raises(DatasetError) as refused:
        import_minari(tmp_path / "source", tmp_path / "out")
    steps = raw.num_rows - 1
    assert str(refused.value) == (
        f"{path.parent}: column 'terminations' is set at step 2 of {steps}; expected an episode "
        "to end only at its last step"
    )


def test_an_import_with_a_nan_reward_is_refused_and_writes_nothing(tmp_path):
    shutil.copytree(MINARI / "arrow", tmp_path / "source")
    path = tmp_path / "source" / "data" / "3" / "part-0.arrow"
    raw = pa.ipc.open_file(path).read_all()
    rewards = raw.column("rewards").to_numpy().copy()
    rewards[2] = np.nan
    index = raw.schema.get_field_index("rewards")
    raw = raw.set_column(index, "rewards", pa.array(rewards))
    with pa.ipc.new_file(path, raw.schema) as writer:
        writer.write_table(raw)

    with pytest.raises(DatasetError) as refused:
        import_minari(tmp_path / "source", tmp_path / "out")
    # The message `offmeta data validate` gives, naming the file the import would have written.
    assert str(refused.value) == (
        f"{tmp_path / 'out' / 'part-00000.parquet'}: column 'rewards' has non-finite values "
        "(NaN or inf) in 1 of 316 rows, first at eps_id 3 t 2; expected finite numbers in "
        "every row. Fix: drop the episodes holding them or repair the values where they were "
        "recorded"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["source"]


@pytest.fixture
def _data_commands_only(monkeypatch):
    monkeypatch.setattr(flows.cli, "_GROUPS", ("data",))


@pytest.mark.usefixtures("_data_commands_only")
def test_cli_imports_then_validates(tmp_path, capsys):
    out = tmp_path / "cartpole"
    assert flows.cli.main(["data", "import", "rllib", str(RLLIB), "--out", str(out)]) == 0
    shown = capsys.readouterr()
    fingerprint = inspect_episodes(out).fingerprint
    assert shown.out == (
        "imported 128 rows, 7 episodes, 1 task(s), 1 module(s) from 192 source rows, dropped 64 "
        f"duplicate rows into {out} (1 file(s), fingerprint {fingerprint[:12]})\n"
    )
    assert shown.err.splitlines() == [
        "rllib: read 192 files, 192 rows; sorting",
        "wrote part-00000.parquet (128 rows so far)",
    ]
    assert flows.cli.main(["data", "validate", str(out)]) == 0
    assert f"{out}: OK" in capsys.readouterr().out

    argv = ["data", "import", "minari", str(MINARI / "arrow"), "--out", str(tmp_path / "m")]
    assert flows.cli.main([*argv, "--task-id", "balance"]) == 0
    assert "316 rows, 12 episodes" in capsys.readouterr().out
    assert inspect_episodes(tmp_path / "m").task_ids == ("balance",)


@pytest.mark.usefixtures("_data_commands_only")
def test_cli_import_refusal_exits_1_with_the_message(tmp_path, capsys):
    argv = ["data", "import", "minari", str(MINARI / "hdf5"), "--out", str(tmp_path / "o")]
    assert flows.cli.main(argv) == 1
    shown = capsys.readouterr()
    assert shown.out == ""
    assert shown.err.startswith(
        f"offmeta data import minari: {MINARI / 'hdf5' / 'data' / 'metadata.json'}: data_format "
        "is 'hdf5'"
    )
