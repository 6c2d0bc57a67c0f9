"""uint8 image observations: accepted as 3-D ``fixed_shape_tensor<uint8>`` in the layout
``dataset.json`` declares (``CHW`` by default), refused in one line otherwise. No Ray."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table, tensor, write


def _images(shape: tuple[int, ...], rows: int = 6, seed: int = 0) -> pa.Array:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
    return pa.FixedShapeTensorArray.from_numpy_ndarray(values)


def _metadata(directory, **fields) -> None:
    (directory / "dataset.json").write_text(json.dumps({"id": "pixels", **fields}))


def _refused(source, **kwargs) -> str:
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(source, **kwargs)
    return str(caught.value)


def test_chw_images_are_accepted_by_default(tmp_path):
    table = episode_table(obs=_images((3, 4, 5)), new_obs=_images((3, 4, 5), seed=1))
    write(tmp_path / "part.parquet", table)

    info = inspect_episodes(tmp_path)

    assert info.schema.obs_shape == (3, 4, 5)
    assert info.schema.obs_layout == "CHW"
    assert info.schema.module_obs_shape == (3, 4, 5)
    assert info.summary()["observation_layout"] == "CHW"
    assert info.values.rows == 6


def test_hwc_images_declared_in_dataset_json(tmp_path):
    write(tmp_path / "part.parquet", episode_table(obs=_images((4, 5, 3))))
    _metadata(tmp_path, observation_layout="HWC")

    schema = inspect_episodes(tmp_path).schema

    assert (schema.obs_shape, schema.obs_layout, schema.module_obs_shape) == (
        (4, 5, 3),
        "HWC",
        (3, 4, 5),
    )


def test_float_observations_have_no_layout(tmp_path):
    write(tmp_path / "part.parquet", episode_table())
    info = inspect_episodes(tmp_path)
    assert info.schema.obs_layout is None
    assert "observation_layout" not in info.summary()


@pytest.mark.parametrize(
    ("obs", "found"),
    [
        (_images((12,)), "fixed_shape_tensor<uint8>[12]"),
        (_images((2, 3, 4, 5)), "fixed_shape_tensor<uint8>[2,3,4,5]"),
        (
            pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(36, np.uint8)), 6),
            "fixed_size_list<uint8>[6]",
        ),
    ],
)
def test_uint8_observations_that_are_not_3d_images_are_refused(tmp_path, obs, found):
    path = write(tmp_path / "part.parquet", episode_table(obs=obs))
    assert _refused(path) == (
        f"{path}: column 'obs' has type {found}; expected a 3-D image [C, H, W] or "
        "[H, W, C] for uint8 observations. Fix: write images with "
        "pyarrow.FixedShapeTensorArray.from_numpy_ndarray(images) from uint8 "
        "[rows, C, H, W] (or [rows, H, W, C] with observation_layout 'HWC' in dataset.json), "
        "or store other observations as float32"
    )


def test_uint8_new_obs_that_is_not_an_image_names_its_column(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table(new_obs=_images((12,))))
    assert _refused(path).startswith(
        f"{path}: column 'new_obs' has type fixed_shape_tensor<uint8>[12]; expected a 3-D image"
    )


def test_a_layout_for_float_observations_is_a_contradiction(tmp_path):
    path = write(tmp_path / "part.parquet", episode_table())
    _metadata(tmp_path, observation_layout="HWC")
    assert _refused(tmp_path) == (
        f"{tmp_path}/dataset.json: observation_layout is 'HWC' but column 'obs' in {path} "
        "holds float32 observations of shape [3]; expected observation_layout only for uint8 "
        "image observations (remove it from dataset.json, or store the images as "
        "fixed_shape_tensor<uint8>)"
    )


def test_an_unknown_layout_is_refused(tmp_path):
    write(tmp_path / "part.parquet", episode_table(obs=_images((3, 4, 5))))
    _metadata(tmp_path, observation_layout="WHC")
    assert _refused(tmp_path) == (
        f"{tmp_path}/dataset.json: field 'observation_layout': Input should be 'CHW' or "
        "'HWC'; expected the fields of docs/data-contract.md#dataset-json"
    )


def test_new_obs_must_hold_images_when_obs_does(tmp_path):
    table = episode_table(obs=_images((3, 2, 2)), new_obs=tensor(np.zeros((6, 3, 2, 2))))
    path = write(tmp_path / "part.parquet", table)
    assert _refused(path) == (
        f"{path}: column 'new_obs' has type fixed_shape_tensor<float32>[3,2,2] but 'obs' has "
        "type fixed_shape_tensor<uint8>[3,2,2]; expected 'new_obs' to have the element type "
        "of 'obs'"
    )


def test_observation_space_shape_is_the_stored_shape(tmp_path):
    write(tmp_path / "part.parquet", episode_table(obs=_images((4, 5, 3))))
    _metadata(
        tmp_path,
        observation_layout="HWC",
        observation_space={"kind": "box", "shape": [3, 4, 5], "low": 0, "high": 255},
    )
    assert _refused(tmp_path).startswith(
        f"{tmp_path}/dataset.json: observation_space.shape is [3, 4, 5] but column 'obs' in "
    )
