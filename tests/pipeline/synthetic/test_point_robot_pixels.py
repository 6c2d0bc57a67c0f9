"""The pixel point robot: the camera, the generator (point_robot's episodes, filmed) and the
Gymnasium environment that draws with the same camera."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import PointRobotPixelTasks, PointRobotTasks, generate
from pipeline.synthetic.point_robot import EPISODE_STEPS
from pipeline.synthetic.point_robot_pixels import VIEW, render
from pipeline.synthetic.point_robot_pixels_env import SUCCESS_RADIUS, make_env


def test_render_draws_the_robot_where_it_is_in_either_layout():
    # The centre of pixel (row 8, column 16) of a 32x32 view.
    x_min, x_max, y_min, y_max = VIEW
    x = x_min + 16.5 / 32 * (x_max - x_min)
    y = y_max - 8.5 / 32 * (y_max - y_min)
    chw = render(np.array([[x, y], [9.0, 9.0]]))
    hwc = render(np.array([[x, y]]), layout="HWC")

    assert (chw.dtype, chw.shape, hwc.shape) == (np.uint8, (2, 1, 32, 32), (1, 32, 32, 1))
    assert np.unravel_index(chw[0, 0].argmax(), (32, 32)) == (8, 16)
    assert chw[0, 0, 8, 16] == 255
    assert np.array_equal(hwc[0, :, :, 0], chw[0, 0])
    assert not chw[1].any()  # outside the view: an empty picture
    # Canonical strides, so that pyarrow keeps the shape as written.
    assert chw.strides == (1024, 1024, 32, 1)


def test_pixels_are_point_robots_episodes_filmed(tmp_path):
    options = {"tasks": 3, "heldout_tasks": 2, "seed": 5}
    generate(PointRobotTasks(episodes_per_task=2), tmp_path / "positions", **options)
    generate(
        PointRobotPixelTasks(episodes_per_task=2, image_size=16), tmp_path / "pixels", **options
    )

    for split in ("train", "heldout"):
        positions = pq.read_table(tmp_path / "positions" / split / "part-00000.parquet")
        pixels = pq.read_table(tmp_path / "pixels" / split / "part-00000.parquet")
        for name in ("obs", "new_obs"):
            drawn = render(
                positions.column(name).combine_chunks().to_numpy_ndarray(), image_size=16
            )
            assert np.array_equal(pixels.column(name).combine_chunks().to_numpy_ndarray(), drawn)
        for name in ("eps_id", "t", "actions", "rewards", "truncateds", "task_id"):
            assert pixels.column(name).equals(positions.column(name))


def test_generated_pixels_pass_the_contract_in_both_layouts(tmp_path):
    family = PointRobotPixelTasks(episodes_per_task=1, image_size=8, layout="HWC", new_obs=False)
    written = generate(family, tmp_path, tasks=2, heldout_tasks=1)

    info = inspect_episodes(written["train"])

    assert info.schema.obs_shape == (8, 8, 1)
    assert (info.schema.obs_layout, info.schema.module_obs_shape) == ("HWC", (1, 8, 8))
    assert not info.schema.has_new_obs
    assert info.metadata["observation_space"] == {
        "kind": "box",
        "shape": [8, 8, 1],
        "low": 0.0,
        "high": 255.0,
    }
    assert info.num_rows == 2 * EPISODE_STEPS


def test_the_family_refuses_bad_camera_settings():
    with pytest.raises(ValueError, match=r"^image_size must be at least 4 pixels, got 2$"):
        PointRobotPixelTasks(image_size=2)
    with pytest.raises(ValueError, match=r"^blob_sigma must be > 0 pixels, got 0.0$"):
        PointRobotPixelTasks(blob_sigma=0.0)
    with pytest.raises(ValueError, match=r"^layout must be CHW or HWC, got 'WHC'$"):
        PointRobotPixelTasks(layout="WHC")  # type: ignore[arg-type]


def test_the_env_shows_the_camera_and_rewards_the_distance():
    env = make_env("heldout-00000", {"goal": [0.0, 1.0]}, image_size=16)
    obs, info = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    assert np.array_equal(obs, render(np.array([info["position"]]), image_size=16)[0])

    total, steps = 0.0, 0
    truncated = False
    while not truncated:
        obs, reward, terminated, truncated, info = env.step(np.array([0.0, 0.1], np.float32))
        position = np.array(info["position"])
        assert reward == pytest.approx(-np.linalg.norm(position - [0.0, 1.0]), abs=1e-6)
        assert not terminated
        total, steps = total + reward, steps + 1
    assert steps == EPISODE_STEPS
    # Straight up at full speed for 20 steps overshoots the goal at distance 1.
    assert info["is_success"] is bool(np.linalg.norm(position - [0.0, 1.0]) <= SUCCESS_RADIUS)
    assert info["is_success"] is False


def test_the_env_factory_needs_a_goal():
    with pytest.raises(ValueError) as caught:
        make_env("t-1", {"angle": 0.3})
    assert str(caught.value) == (
        "task 't-1': parameters {'angle': 0.3} have no 'goal'; expected the "
        "point_robot_pixels task entry of dataset.json, {'goal': [x, y]}"
    )
