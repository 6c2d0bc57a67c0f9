"""The committed samples: valid, within the size budget, and rebuilt byte for byte from the
generator arguments their own dataset.json records."""

from __future__ import annotations

import pytest

from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import GENERATORS, generate
from tests.helpers.paths import REPO

SAMPLES = REPO / "data" / "samples"
NAMES = ("sinusoid", "point_robot", "point_robot_mixed", "point_robot_pixels")
_RUN_ARGUMENTS = ("tasks", "heldout_tasks", "seed", "rows_per_file")


def test_samples_fit_the_size_budget():
    # 5 MiB for offmeta's own families and the real-tool recordings, 1 MiB for Meta-World's.
    total = sum(f.stat().st_size for f in SAMPLES.rglob("*") if f.is_file())
    assert total <= 6 * 1024 * 1024


@pytest.mark.parametrize("name", NAMES)
def test_sample_is_rebuilt_from_its_recorded_arguments(tmp_path, name):
    committed = {s: inspect_episodes(SAMPLES / name / s) for s in ("train", "heldout")}
    args = dict(committed["train"].metadata["generator"]["args"])
    run = {key: args.pop(key) for key in _RUN_ARGUMENTS}

    family = GENERATORS[committed["train"].metadata["generator"]["name"]]
    written = generate(family(**args), tmp_path, **run)

    for split, directory in written.items():
        assert inspect_episodes(directory).fingerprint == committed[split].fingerprint
    assert committed["heldout"].metadata["generator"] == committed["train"].metadata["generator"]
