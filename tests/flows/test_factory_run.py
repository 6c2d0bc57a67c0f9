"""A network factory defined outside the package (`tests/learners/models/factory_nets.py`,
imported as `factory_nets` from its folder) trains through ``offmeta run`` on the sinusoid
sample, is published with its path and kwargs, and is rebuilt by ``load_learner`` in a fresh
process with the same predictions; a consumer without the module is refused in one line."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from flows.cli import main
from pipeline.artifacts import ArtifactStore, Manifest
from pipeline.consumer import load_learner, predict
from tests.helpers.paths import REPO

pytestmark = pytest.mark.usefixtures("prefect_harness", "ray_session")

NETS_DIR = REPO / "tests" / "learners" / "models"
FACTORY = "factory_nets:normed_net"
MODULE = "default_policy"
SAMPLE = REPO / "data" / "samples" / "sinusoid"
# Loads the published learner, adapts it on a fixed support set and saves its predictions
# before and after: what a consumer job does.
CONSUMER = """
import sys, torch
from pipeline.consumer import load_learner, predict
try:
    learner = load_learner("sine-factory:1", root=sys.argv[1])
except ValueError as error:
    print(error, file=sys.stderr)
    sys.exit(3)
x = torch.linspace(-5, 5, 11).unsqueeze(1)
adapted = learner.adapt(None, {"default_policy": {"obs": x, "actions": 2 * torch.sin(x)}})
torch.save({"before": predict(learner, x), "after": predict(learner, x, params=adapted)},
           sys.argv[2])
"""


@dataclass(frozen=True)
class Published:
    root: Path
    manifest: Manifest
    predictions: dict[str, torch.Tensor]
    """This process's predictions of the published learner, before and after adaptation."""


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Published:
    work = tmp_path_factory.mktemp("factory_run")
    settings = [
        f"data.train={SAMPLE / 'train'}",
        f"data.heldout={SAMPLE / 'heldout'}",
        f"artifacts.root={work / 'artifacts'}",
        "artifacts.name=sine-factory",
        f"training.checkpoint_dir={work / 'runs'}",
        "training.iterations=3",
        "training.log_every=1",
        "training.checkpoint_every=3",
        "evaluation.tasks=4",
        f"learners.modules.{MODULE}.model.factory={FACTORY}",
        f"learners.modules.{MODULE}.model.kwargs.width=16",
    ]
    args = ["run", "--config", str(REPO / "flows" / "configs" / "sinusoid.yaml")]
    args += [word for setting in settings for word in ("--set", setting)]
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(NETS_DIR))
        with contextlib.redirect_stdout(stdout):
            status = main(args)
        assert status == 0, stdout.getvalue()
        root = work / "artifacts"
        learner = load_learner("sine-factory:1", root=root)
        x = torch.linspace(-5, 5, 11).unsqueeze(1)
        adapted = learner.adapt(None, {MODULE: {"obs": x, "actions": 2 * torch.sin(x)}})
        predictions = {"before": predict(learner, x), "after": predict(learner, x, params=adapted)}
        store = ArtifactStore(root)
        manifest = store.get("sine-factory")
        trained = store.load_params("sine-factory:1")
        for name, tensor in trained[MODULE].items():
            assert torch.equal(learner.meta_params[MODULE][name], tensor)
    return Published(root, manifest, predictions)


def _consumer(published: Published, out: Path, pythonpath: list[Path]):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, pythonpath))}
    return subprocess.run(
        [sys.executable, "-c", CONSUMER, str(published.root), str(out)],
        cwd=out.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_manifest_holds_the_factory_path_and_kwargs(published: Published) -> None:
    model = published.manifest.config["learners"]["modules"][MODULE]["model"]
    assert (model["factory"], model["kwargs"]) == (FACTORY, {"width": 16})
    state = json.loads(
        ArtifactStore(published.root).read_file("sine-factory:1", "learner_state.json")
    )
    assert state["config"]["modules"][MODULE]["model"]["factory"] == FACTORY


def test_a_fresh_process_rebuilds_the_network_with_the_same_predictions(
    published: Published, tmp_path: Path
) -> None:
    out = tmp_path / "predictions.pt"
    done = _consumer(published, out, [REPO, NETS_DIR])
    assert done.returncode == 0, done.stderr
    found = torch.load(out)
    assert torch.equal(found["before"], published.predictions["before"])
    assert torch.equal(found["after"], published.predictions["after"])
    assert not torch.equal(found["before"], found["after"])


def test_a_consumer_without_the_factory_module_is_refused_in_one_line(
    published: Published, tmp_path: Path
) -> None:
    done = _consumer(published, tmp_path / "predictions.pt", [REPO])
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == (
        f"learners.modules.{MODULE}.model.factory '{FACTORY}': cannot import 'factory_nets' "
        "(no module named 'factory_nets'); install the package that defines it or put it on "
        "PYTHONPATH\n"
    )


def test_offmeta_run_refuses_a_factory_it_cannot_import_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["run", "--config", str(REPO / "flows" / "configs" / "sinusoid.yaml")]
    settings = [
        f"data.train={SAMPLE / 'train'}",
        f"data.heldout={SAMPLE / 'heldout'}",
        f"artifacts.root={tmp_path / 'artifacts'}",
        f"training.checkpoint_dir={tmp_path / 'runs'}",
        f"learners.modules.{MODULE}.model.factory=no_such_nets:net",
    ]
    args += [word for setting in settings for word in ("--set", setting)]
    assert main(args) == 1
    assert capsys.readouterr().err == (
        f"offmeta run: learners.modules.{MODULE}.model.factory 'no_such_nets:net': cannot "
        "import 'no_such_nets' (no module named 'no_such_nets'); install the package that "
        "defines it or put it on PYTHONPATH\n"
    )
    assert not (tmp_path / "runs").exists() and not (tmp_path / "artifacts").exists()
