"""uint8 images stay uint8 through collate and task sampling, and finalize turns them into
float32 ``[..., C, H, W]`` in ``[0, 1]`` on the device, whatever their stored layout."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from pipeline.reads.episodes import inspect_episodes
from pipeline.streams.collate import collate, finalize
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.samples import task_samples
from tests.helpers.episode_files import episode_table, write


def _images(rows: int, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, *shape), dtype=np.uint8)


def _table(images: np.ndarray, tasks: tuple[str, ...] = ("a", "b")) -> pa.Table:
    rows = len(images)
    return episode_table(
        rows,
        episode_length=4,
        tasks=tasks,
        obs=pa.FixedShapeTensorArray.from_numpy_ndarray(images),
        new_obs=pa.FixedShapeTensorArray.from_numpy_ndarray(images[::-1].copy()),
    )


def test_collate_keeps_images_uint8():
    images = _images(8, (3, 4, 5))
    batch = collate(_table(images))
    obs = batch["default_policy"]["obs"]
    assert obs.dtype == torch.uint8
    assert torch.equal(obs, torch.from_numpy(images))


def test_finalize_scales_chw_images_to_float():
    images = _images(8, (3, 4, 5))
    batch = collate(_table(images))

    moved = finalize(batch, "cpu")["default_policy"]

    assert moved["obs"].dtype == torch.float32
    assert torch.equal(moved["obs"], torch.from_numpy(images).float() / 255)
    assert torch.equal(moved["new_obs"], torch.from_numpy(images[::-1].copy()).float() / 255)
    assert moved["actions"] is batch["default_policy"]["actions"]


def test_finalize_permutes_hwc_images_to_chw():
    images = _images(8, (4, 5, 3))
    batch = collate(_table(images))

    obs = finalize(batch, "cpu", obs_layout="HWC")["default_policy"]["obs"]

    assert obs.shape == (8, 3, 4, 5)
    assert obs.is_contiguous()
    expected = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()).float() / 255
    assert torch.equal(obs, expected)


def test_finalize_permutes_the_last_three_axes_of_a_meta_batch():
    images = torch.from_numpy(_images(2 * 5, (4, 5, 3))).reshape(2, 5, 4, 5, 3)
    meta = {"support": {"m": {"obs": images}}, "query": {"m": {"obs": images[:, :2]}}}

    moved = finalize(meta, "cpu", obs_layout="HWC")

    assert moved["support"]["m"]["obs"].shape == (2, 5, 3, 4, 5)
    assert torch.equal(moved["query"]["m"]["obs"], images[:, :2].permute(0, 1, 4, 2, 3) / 255)


def test_finalize_leaves_other_uint8_columns_alone():
    codes = torch.arange(6, dtype=torch.uint8)
    moved = finalize({"m": {"codes": codes}}, "cpu")
    assert moved["m"]["codes"] is codes


def test_task_streams_deliver_float_chw_images(tmp_path):
    images = _images(48, (5, 6, 3))
    write(tmp_path / "part.parquet", _table(images, tasks=("only",)))
    (tmp_path / "dataset.json").write_text(json.dumps({"id": "px", "observation_layout": "HWC"}))
    samples = task_samples(
        inspect_episodes(tmp_path), support=4, query=4, mode="stream", memory_budget_mb=16
    )
    (stream,) = split_for_learners(samples, 1, minibatch_size=2, seed=0)

    with stream:
        (meta,) = stream.take(1)

    for part in ("support", "query"):
        obs = meta[part]["default_policy"]["obs"]
        assert (obs.dtype, obs.shape) == (torch.float32, (2, 4, 3, 5, 6))
        assert float(obs.min()) >= 0.0 and float(obs.max()) <= 1.0
    stored = {bytes(row) for row in images.reshape(48, -1)}
    delivered = meta["support"]["default_policy"]["obs"].permute(0, 1, 3, 4, 2) * 255
    as_bytes = delivered.round().to(torch.uint8).reshape(-1, 5 * 6 * 3).numpy()
    assert all(bytes(row) in stored for row in as_bytes)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_images_cross_to_cuda_as_uint8_and_arrive_as_float():
    images = _images(16, (4, 5, 3))
    batch = collate(_table(images))
    compute = torch.cuda.Stream()
    with torch.cuda.stream(compute):
        obs = finalize(batch, "cuda", obs_layout="HWC")["default_policy"]["obs"]
    compute.synchronize()
    assert (obs.device.type, obs.dtype, obs.shape) == ("cuda", torch.float32, (16, 3, 4, 5))
    expected = torch.from_numpy(images.transpose(0, 3, 1, 2).copy()).float() / 255
    assert torch.equal(obs.cpu(), expected)
