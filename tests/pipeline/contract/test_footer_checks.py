"""Bad datasets are refused before Ray starts, with messages naming file, column, what was
found and what was expected. Every test here runs without Ray (``inspect_episodes`` runs
the same checks as ``read_episodes``)."""

from __future__ import annotations

import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table, fixed_list, tensor, write


def _refused(source, **kwargs) -> str:
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(source, **kwargs)
    return str(caught.value)


def _metadata(directory, **fields) -> None:
    document = {"id": "tiny", **fields}
    (directory / "dataset.json").write_text(json.dumps(document))


def test_missing_required_column(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table(rewards=None))
    assert _refused(path) == (
        f"{path}: missing required column 'rewards'; found columns eps_id, t, obs, actions, "
        "terminateds, truncateds, task_id. Fix: add it, or map it with "
        "column_map={'rewards': '<name on disk>'} (--column-map rewards=<name on disk>)"
    )


@pytest.mark.parametrize("name", ["obs", "notes"])
def test_two_columns_of_one_name_are_refused(tmp_path, name):
    """Parquet allows it; a read by name could not say which one is meant."""
    table = episode_table(notes=pa.array(["x"] * 6))
    table = table.append_column(name, table.column(name))
    path = write(tmp_path / "part.parquet", table)
    assert _refused(tmp_path) == (
        f"{path}: column {name!r} appears 2 times; expected each column name once. Fix: "
        "rename or drop the repeated columns"
    )


def test_missing_column_named_by_the_column_map(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table())
    assert _refused(path, column_map={"rewards": "reward"}) == (
        f"{path}: missing required column 'rewards' (read from 'reward' by column_map); found "
        "columns eps_id, t, obs, actions, rewards, terminateds, truncateds, task_id. Fix: "
        "correct the column map"
    )


@pytest.mark.parametrize(
    ("column", "value", "found", "expected"),
    [
        (
            "rewards",
            pa.array(np.zeros(6), pa.float64()),
            "float64",
            "float32. Fix: cast with pyarrow.compute.cast(rewards, pyarrow.float32())",
        ),
        (
            "obs",
            pa.array(np.zeros(6, np.float32)),
            "float32",
            "fixed_shape_tensor<float32> or fixed_size_list<float32>, or "
            "fixed_shape_tensor<uint8> of 3 dimensions (images). Fix: write observations "
            "with pyarrow.FixedShapeTensorArray.from_numpy_ndarray(obs.astype('float32')), "
            "images as uint8 [rows, C, H, W] or [rows, H, W, C]; a 1-D observation has "
            "shape (1,)",
        ),
        (
            "obs",
            pa.FixedShapeTensorArray.from_numpy_ndarray(np.zeros((6, 3))),
            "fixed_shape_tensor<float64>[3]",
            "fixed_shape_tensor<float32> or fixed_size_list<float32>, or "
            "fixed_shape_tensor<uint8> of 3 dimensions (images). Fix: write observations "
            "with pyarrow.FixedShapeTensorArray.from_numpy_ndarray(obs.astype('float32')), "
            "images as uint8 [rows, C, H, W] or [rows, H, W, C]; a 1-D observation has "
            "shape (1,)",
        ),
        (
            "actions",
            pa.array(np.zeros(6, np.int32)),
            "int32",
            "int64 (discrete) or fixed_shape_tensor<float32> or fixed_size_list<float32>. "
            "Fix: store discrete actions as int64, continuous ones with "
            "pyarrow.FixedShapeTensorArray.from_numpy_ndarray(actions.astype('float32')); "
            "a scalar target has shape (1,)",
        ),
        (
            "t",
            pa.array(np.zeros(6), pa.float32()),
            "float32",
            "int32 or int64. Fix: store step indices as integers",
        ),
        (
            "eps_id",
            pa.array(np.zeros(6), pa.float64()),
            "float64",
            "string or int64. Fix: store episode ids as strings or int64",
        ),
        (
            "terminateds",
            pa.array(np.zeros(6, np.int8)),
            "int8",
            "bool. Fix: store episode-end flags as booleans",
        ),
        (
            "task_id",
            pa.array(np.arange(6)),
            "int64",
            "string or dictionary<string>. Fix: store task ids as strings",
        ),
    ],
)
def test_wrong_type(tmp_path, column, value, found, expected):
    path = write(tmp_path / "part.parquet", episode_table(**{column: value}))
    assert _refused(path) == f"{path}: column {column!r} has type {found}; expected {expected}"


def test_wrong_type_names_the_column_on_disk(tmp_path):
    table = episode_table(rewards=None, reward=pa.array(np.zeros(6), pa.float64()))
    path = write(tmp_path / "part.parquet", table)
    assert _refused(path, column_map={"rewards": "reward"}).startswith(
        f"{path}: column 'rewards' (on disk 'reward') has type float64; expected float32."
    )


def test_obs_width_differs_between_files(tmp_path):
    a = write(tmp_path / "a.parquet", episode_table(obs_dim=3))
    b = write(tmp_path / "b.parquet", episode_table(obs_dim=4))
    assert _refused(tmp_path) == (
        f"{b}: column 'obs' has shape [4] but {a} has [3]; expected one shape across all files"
    )


def test_action_width_differs_between_files(tmp_path):
    a = write(tmp_path / "a.parquet", episode_table(action_dim=2))
    b = write(tmp_path / "b.parquet", episode_table(action_dim=1))
    assert _refused([a, b]) == (
        f"{b}: column 'actions' has shape [1] but {a} has [2]; expected one shape across all files"
    )


def test_type_differs_between_files(tmp_path):
    a = write(tmp_path / "a.parquet", episode_table())
    b = write(tmp_path / "b.parquet", episode_table(obs=fixed_list(np.zeros((6, 3)))))
    assert _refused(tmp_path) == (
        f"{b}: column 'obs' has type fixed_size_list<float32>[3] but {a} has "
        "fixed_shape_tensor<float32>[3]; expected one type per column across all files. "
        "Fix: rewrite the file with the type the others use"
    )


def test_columns_differ_between_files(tmp_path):
    a = write(tmp_path / "a.parquet", episode_table())
    b = write(tmp_path / "b.parquet", episode_table(task_id=None, extra=pa.array(range(6))))
    assert _refused(tmp_path) == (
        f"{b}: columns differ from {a} (missing 'task_id'; extra 'extra'); expected every file "
        "to have the same columns"
    )


def test_new_obs_shape_must_match_obs(tmp_path):
    path = write(tmp_path / "p.parquet", episode_table(new_obs=tensor(np.zeros((6, 2)))))
    assert _refused(path) == (
        f"{path}: column 'new_obs' has shape [2] but 'obs' has shape [3]; expected 'new_obs' to "
        "have the shape of 'obs'"
    )


def test_not_parquet(tmp_path):
    path = tmp_path / "notes.parquet"
    path.write_text("eps_id,t,obs\n1,0,0.5\n")
    assert re.fullmatch(
        re.escape(f"{path}: not a readable Parquet file (")
        + r".+"
        + re.escape(
            "); expected a complete Parquet file (was it truncated while being written, or is "
            "it another format?)"
        ),
        _refused(path),
    )


def test_truncated_file(tmp_path):
    good = write(tmp_path / "good.parquet", episode_table())
    cut = tmp_path / "cut" / "part.parquet"
    cut.parent.mkdir()
    cut.write_bytes(good.read_bytes()[:-20])
    assert _refused(cut).startswith(f"{cut}: not a readable Parquet file (")


def test_corrupted_data_behind_a_valid_footer(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table(1000))
    damaged = bytearray(path.read_bytes())
    damaged[4:400] = b"\xff" * 396
    path.write_bytes(bytes(damaged))
    assert re.fullmatch(
        re.escape(f"{path}: columns eps_id, t, terminateds, truncateds, task_id cannot be read (")
        + r"[^\n]+"
        + re.escape(
            "); expected readable Parquet data behind a valid footer (is the file corrupted?)"
        ),
        _refused(path),
    )


def _obs_with_nulls(null_rows=(), null_elements=()) -> pa.Array:
    """Six 3-float observations; whole rows null, or one element of a row null."""
    element_mask = np.zeros(18, bool)
    element_mask[[3 * r + 1 for r in null_elements]] = True
    row_mask = pa.array(np.isin(np.arange(6), null_rows))
    values = pa.array(np.arange(18, dtype=np.float32), mask=element_mask)
    storage = pa.FixedSizeListArray.from_arrays(values, 3, mask=row_mask)
    return pa.ExtensionArray.from_storage(pa.fixed_shape_tensor(pa.float32(), [3]), storage)


@pytest.mark.parametrize(
    ("column", "value", "nulls"),
    [
        ("obs", _obs_with_nulls(null_rows=[1], null_elements=[4]), 2),
        ("obs", _obs_with_nulls(null_elements=[0, 2, 5]), 3),
        ("eps_id", pa.array([0, 0, None, 1, 1, 1], pa.int64()), 1),
        ("t", pa.array([0, 1, 2, None, 1, None], pa.int32()), 2),
        ("actions", pa.array([0, 1, None, 3, 0, 1], pa.int64()), 1),
        ("rewards", pa.array([None] * 6, pa.float32()), 6),
        ("terminateds", pa.array([False, False, True, False, None, True]), 1),
        ("truncateds", pa.array([None, False, False, False, False, False]), 1),
        ("task_id", pa.array(["a", "a", "a", None, None, None]), 3),
    ],
)
@pytest.mark.parametrize("statistics", [True, False], ids=["footer", "scan"])
def test_nulls_in_a_canonical_column(tmp_path, column, value, nulls, statistics):
    path = tmp_path / "part.parquet"
    pq.write_table(episode_table(**{column: value}), path, write_statistics=statistics)
    assert _refused(path) == (
        f"{path}: column {column!r} has nulls in {nulls} of 6 rows; expected a value in every "
        "row of every canonical column. Fix: drop or fill those rows"
    )


def test_files_without_statistics_are_scanned_and_accepted_when_clean(tmp_path):
    path = tmp_path / "part.parquet"
    pq.write_table(episode_table(new_obs=_obs_with_nulls()), path, write_statistics=False)
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).statistics is None
    assert inspect_episodes(path).num_rows == 6


def test_nulls_are_named_by_the_column_on_disk(tmp_path):
    reward = pa.array([0, 1, 2, 3, None, 5], pa.float32())
    a = write(tmp_path / "a.parquet", episode_table(rewards=None, reward=reward.fill_null(0)))
    b = write(tmp_path / "b.parquet", episode_table(rewards=None, reward=reward, first_episode=2))
    assert inspect_episodes(a, column_map={"rewards": "reward"}).num_rows == 6
    assert _refused(tmp_path, column_map={"rewards": "reward"}) == (
        f"{b}: column 'rewards' (on disk 'reward') has nulls in 1 of 6 rows; expected a value "
        "in every row of every canonical column. Fix: drop or fill those rows"
    )


def test_nulls_outside_the_contract_pass_through(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table(note=pa.array([None, "x"] * 3)))
    assert inspect_episodes(path).schema.extra_columns == ("note",)


def test_empty_directory(tmp_path):
    (tmp_path / "README.md").write_text("no data here")
    assert _refused(tmp_path) == (
        f"no Parquet files found at {str(tmp_path)!r}; expected *.parquet files (a file, a "
        "directory holding them, a glob, or a list of these)"
    )


def test_zero_rows_names_the_files(tmp_path):
    files = [write(tmp_path / f"part-{i}.parquet", episode_table().slice(0, 0)) for i in range(7)]
    assert _refused(tmp_path) == (
        f"source {str(tmp_path)!r}: 0 rows in 7 file(s) ({', '.join(map(str, files[:5]))} and 2 "
        "more); expected at least one transition (were the files written before any data "
        "arrived?)"
    )
    assert _refused(files[0]) == (
        f"source {str(files[0])!r}: 0 rows in 1 file(s) ({files[0]}); expected at least one "
        "transition (were the files written before any data arrived?)"
    )


def test_missing_source_and_empty_list(tmp_path):
    missing = tmp_path / "nowhere"
    assert _refused(missing) == (
        f"source {str(missing)!r} does not exist; expected a Parquet file, a directory or a glob"
    )
    assert _refused([]) == (
        "source is an empty list; expected at least one file, directory or glob"
    )
    assert _refused(str(tmp_path / "*.parquet")).startswith("no Parquet files found at")


def test_directory_of_several_datasets(tmp_path):
    for split in ("train", "heldout"):
        write(tmp_path / split / "part.parquet", episode_table())
        _metadata(tmp_path / split, split=split)
    assert _refused(tmp_path) == (
        f"source {str(tmp_path)!r} holds several datasets (heldout/dataset.json, "
        "train/dataset.json); expected one dataset: point at one of them, e.g. "
        f"{str(tmp_path / 'heldout')!r}"
    )


@pytest.mark.parametrize(
    ("column_map", "message"),
    [
        (
            {"observation": "obs"},
            "column_map: unknown canonical column 'observation' (mapped to 'obs'); expected one "
            "of eps_id, t, obs, actions, rewards, terminateds, truncateds, new_obs, task_id, "
            "module_id as keys (canonical name -> name on disk)",
        ),
        (
            {"obs": "x", "new_obs": "x"},
            "column_map: 'obs' and 'new_obs' both map to 'x'; expected each column on disk to "
            "feed one canonical column",
        ),
    ],
)
def test_bad_column_map(tmp_path, column_map, message):
    path = write(tmp_path / "part.parquet", episode_table())
    assert _refused(path, column_map=column_map) == message


def test_column_map_onto_a_name_already_present(tmp_path):
    path = write(tmp_path / "p.parquet", episode_table(observation=tensor(np.zeros((6, 3)))))
    assert _refused(path, column_map={"obs": "observation"}) == (
        f"{path}: column_map reads 'obs' from 'observation', but the file also has a column "
        "named 'obs'; expected only one of them (rename or drop the other column)"
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"observation_space": {"kind": "box", "shape": [4]}},
            "observation_space.shape is [4] but column 'obs' in {file} has shape [3]",
        ),
        (
            {"action_space": {"kind": "discrete", "n": 4}},
            "action_space.kind is 'discrete' but column 'actions' in {file} holds float32 "
            "tensors (box)",
        ),
        (
            {"action_space": {"kind": "box", "shape": [3]}},
            "action_space.shape is [3] but column 'actions' in {file} has shape [2]",
        ),
        ({"num_rows": 7}, "num_rows is 7 but the 1 file(s) hold 6 rows"),
        (
            {"files": ["part.parquet", "part-2.parquet"]},
            "'files' lists 'part-2.parquet' but it is not in {root}; expected every listed "
            "file to exist",
        ),
        (
            {"files": ["other.parquet"]},
            "file 'part.parquet' is not listed in 'files' (1 files listed); expected only "
            "listed files",
        ),
        (
            {"tasks": {"a": {"goal": [0, 1]}}},
            "task 'b' occurs in column 'task_id' (1 such task(s)) but is not described in "
            "'tasks'; expected every task id to have an entry",
        ),
    ],
)
def test_metadata_contradicting_the_files(tmp_path, fields, message):
    file = write(tmp_path / "part.parquet", episode_table())
    _metadata(tmp_path, **fields)
    expected = message.format(file=file, root=tmp_path)
    assert _refused(tmp_path) == (
        f"{tmp_path}/dataset.json: {expected} (fix dataset.json or the files, or regenerate "
        "the dataset)"
        if "expected" in expected
        else f"{tmp_path}/dataset.json: {expected}; expected them to agree (fix dataset.json "
        "or the files, or regenerate the dataset)"
    )


def test_row_count_is_only_checked_when_every_file_is_read(tmp_path):
    a = write(tmp_path / "a.parquet", episode_table())
    write(tmp_path / "b.parquet", episode_table(first_episode=2))
    _metadata(tmp_path, num_rows=12, files=["a.parquet", "b.parquet"])
    assert inspect_episodes(a).num_rows == 6
    assert inspect_episodes(tmp_path).num_rows == 12


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "{not json",
            "not valid JSON (Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)); expected a JSON object",
        ),
        (
            '{"id": "x", "num_row": 3}',
            "field 'num_row': Extra inputs are not permitted; expected the fields of "
            "docs/data-contract.md#dataset-json",
        ),
        (
            '{"num_rows": "many"}',
            "field 'id': Field required; field 'num_rows': Input should be a valid integer, "
            "unable to parse string as an integer; expected the fields of "
            "docs/data-contract.md#dataset-json",
        ),
    ],
)
def test_malformed_metadata(tmp_path, content, message):
    write(tmp_path / "part.parquet", episode_table())
    (tmp_path / "dataset.json").write_text(content)
    assert _refused(tmp_path) == f"{tmp_path}/dataset.json: {message}"


def test_fingerprint_follows_content(tmp_path):
    a = write(tmp_path / "a.parquet", episode_table(seed=1))
    write(tmp_path / "b.parquet", episode_table(seed=2, first_episode=2))
    _metadata(tmp_path)
    original = inspect_episodes(tmp_path).fingerprint
    assert inspect_episodes(tmp_path).fingerprint == original
    assert inspect_episodes([tmp_path / "b.parquet", a]).fingerprint == original

    write(a, episode_table(seed=3))
    rewritten = inspect_episodes(tmp_path).fingerprint
    assert rewritten != original

    _metadata(tmp_path, description="changed")
    assert inspect_episodes(tmp_path).fingerprint not in (original, rewritten)

    changed_metadata = inspect_episodes(tmp_path).fingerprint
    a.rename(tmp_path / "c.parquet")
    assert inspect_episodes(tmp_path).fingerprint != changed_metadata
