"""Meta-World ML1 through ``offmeta run``: MACAW on the committed push sample for a few
iterations, rolled out in the simulator for a few steps (the smoke test of docs/metaworld.md;
bench/metaworld.py trains on the full sets)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from flows.cli import main
from flows.config import load_config
from flows.stages.datasets import inspect_datasets
from pipeline.artifacts import ArtifactStore
from tests.helpers.paths import REPO

# The simulator smoke test of docs/metaworld.md is a system test (issue 31: Meta-World smoke).
pytestmark = [
    pytest.mark.system,
    pytest.mark.filterwarnings("ignore::UserWarning"),  # metaworld's policy gains
]

CONFIGS = REPO / "flows" / "configs"
POLICIES = ("unadapted", "adapted", "expert")


@pytest.mark.parametrize(
    "name",
    [
        *(f"metaworld_{skill}" for skill in ("reach", "push", "pick_place")),
        "metaworld_push_rl",
        *(
            f"metaworld_{skill}_{variant}"
            for skill in ("reach", "push")
            for variant in ("maml", "macaw")
        ),
    ],
)
def test_the_metaworld_configs_validate_and_fit_their_samples(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    cfg = load_config(CONFIGS / f"{name}.yaml")
    assert cfg.evaluation.env == "pipeline.benchmarks.metaworld_env:ml1_env"
    skill = name.removeprefix("metaworld_")
    for variant in ("_maml", "_macaw", "_rl"):
        skill = skill.removesuffix(variant)
    for split in ("train", "heldout"):
        sample = Path("data/samples") / f"metaworld_{skill}" / split
        assert Path(getattr(cfg.data, split)) == sample
        generator = json.loads((sample / "dataset.json").read_text())["generator"]["args"]
        assert generator["env"] == f"{skill.replace('_', '-')}-v3"
    train, heldout = inspect_datasets(cfg)  # the checks offmeta run makes before training
    assert train.num_episodes > 0 and heldout.num_episodes > 0


@pytest.mark.usefixtures("prefect_harness", "ray_session")
def test_macaw_on_the_push_sample_trains_rolls_out_and_publishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    overrides = [
        "training.iterations=4",
        "training.log_every=2",
        "training.checkpoint_every=4",
        f"training.checkpoint_dir={tmp_path / 'runs'}",
        f"artifacts.root={tmp_path / 'artifacts'}",
        "evaluation.max_episode_steps=15",
        "learners.modules.default_policy.model.hidden_sizes=[16]",
        "learners.modules.value.model.hidden_sizes=[16]",
    ]
    argv = ["run", "--config", str(CONFIGS / "metaworld_push_macaw.yaml")]
    for override in overrides:
        argv += ["--set", override]
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        status = main(argv)
    assert status == 0, stdout.getvalue()

    store = ArtifactStore(tmp_path / "artifacts")
    manifest = store.get("metaworld-push-macaw:1")
    evaluation = json.loads(store.read_file(manifest, "evaluation.json"))
    assert evaluation["environment"] == "pipeline.benchmarks.metaworld_env:ml1_env"
    metrics = manifest.metrics
    for policy in POLICIES:
        assert metrics[f"heldout_episode_length_{policy}"] == 15
        for name in (f"heldout_success_{policy}", f"heldout_success_final_{policy}"):
            assert 0.0 <= metrics[name] <= 1.0
        assert metrics[f"heldout_success_final_{policy}"] <= metrics[f"heldout_success_{policy}"]
    assert "final-step success rate, adapted (1 step)" in stdout.getvalue()
