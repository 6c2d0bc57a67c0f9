"""A run over image observations: the module's obs_shape must be what finalize gives it,
``[C, H, W]`` whatever the stored layout; checked before Ray starts (``inspect_datasets``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import load_config
from flows.stages.datasets import inspect_datasets
from pipeline.contract.schema import DatasetError
from pipeline.synthetic import PointRobotPixelTasks, generate
from tests.helpers.paths import REPO

CONFIG = REPO / "flows" / "configs" / "point_robot_pixels_conv.yaml"


@pytest.fixture(scope="module")
def hwc_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("hwc")
    family = PointRobotPixelTasks(episodes_per_task=1, image_size=8, layout="HWC", new_obs=False)
    generate(family, out, tasks=3, heldout_tasks=2)
    return out


def _config(data: Path, obs_shape: str):
    return load_config(
        CONFIG,
        [
            f"data.train={data / 'train'}",
            f"data.heldout={data / 'heldout'}",
            "learners.modules.default_policy.obs_dim=64",
            f"learners.modules.default_policy.obs_shape={obs_shape}",
            "tasks.meta_batch=2",
        ],
    )


def test_stored_hwc_images_reach_a_conv_module_as_chw(hwc_images: Path) -> None:
    train, heldout = inspect_datasets(_config(hwc_images, "[1, 8, 8]"))
    assert train.schema.module_obs_shape == heldout.schema.module_obs_shape == (1, 8, 8)


def test_an_obs_shape_in_the_stored_layout_is_refused(hwc_images: Path) -> None:
    with pytest.raises(DatasetError) as caught:
        inspect_datasets(_config(hwc_images, "[8, 8, 1]"))
    assert str(caught.value) == (
        f"train dataset {hwc_images / 'train'}: HWC images stored as [8, 8, 1] reach the "
        "module as [1, 8, 8] but learners.modules.default_policy.obs_shape is [8, 8, 1]; "
        "expected obs_shape: [1, 8, 8]"
    )
