"""``pipeline.consumer``: one call loads a published learner, ready to adapt and predict, without
Ray or Prefect."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.func import functional_call

from learners import MetaLearner, build_model
from pipeline.artifacts import ArtifactNotFoundError, ArtifactStore
from pipeline.consumer import (
    LEARNER_JSON,
    LEARNER_TENSORS,
    learner_state_files,
    load_learner,
    predict,
)
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(120)

REPO = REPO
CONFIG = {
    "modules": {
        "default_policy": {"obs_dim": 1, "action_dim": 1, "model": {"hidden_sizes": [8]}},
        "critic": {
            "obs_dim": 2,
            "action_dim": 2,
            "loss": "gaussian_nll",
            "model": {"hidden_sizes": [4], "head": "gaussian"},
        },
    },
    "inner": {"lr": 0.1, "steps": 2},
    "algorithm": "metasgd",
    "dtype": "float64",
}


def _support(x: torch.Tensor) -> dict[str, dict[str, torch.Tensor]]:
    return {"default_policy": {"obs": x, "actions": 2 * torch.sin(x)}}


@pytest.fixture
def trained() -> MetaLearner:
    """A learner after a few meta-steps: its optimizer and learned rates are not the initial
    ones, so a rebuild from the config alone could not pass for it."""
    learner = MetaLearner(CONFIG)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        x = torch.rand(4, 10, 1, generator=generator, dtype=torch.float64) * 10 - 5
        support, query = _support(x[:, :5]), _support(x[:, 5:])
        learner.step({"support": support, "query": query})
    return learner


def _publish(store: ArtifactStore, learner: MetaLearner, name: str = "sine") -> str:
    state = learner.get_state()
    ref = store.publish(
        name,
        state["params"],
        metrics={},
        config=learner.config,
        lineage={},
        files=learner_state_files(state),
    )
    return str(ref)


def test_load_learner_rebuilds_the_published_learner(trained: MetaLearner, tmp_path: Path) -> None:
    _publish(ArtifactStore(tmp_path / "store", durable=False), trained)
    random_state = torch.get_rng_state()
    loaded = load_learner("sine@latest", root=(tmp_path / "store").as_uri(), device="cpu")
    assert torch.equal(torch.get_rng_state(), random_state)  # the caller's RNG is untouched

    expected, found = trained.get_state(), loaded.get_state()
    assert found["config"] == expected["config"]
    assert found["weights_seq_no"] == expected["weights_seq_no"] == 3
    for module, named in expected["params"].items():
        for name, tensor in named.items():
            assert torch.equal(found["params"][module][name], tensor)
            assert found["params"][module][name].dtype == torch.float64
    for key, tensor in expected["log_lrs"].items():
        assert torch.equal(found["log_lrs"][key], tensor)
    assert found["optimizer"]["state"].keys() == expected["optimizer"]["state"].keys()

    # Adapting and predicting give what the trained learner gives, exactly.
    x = torch.linspace(-5, 5, 7, dtype=torch.float64).unsqueeze(1)
    adapted_loaded = loaded.adapt(None, _support(x))
    adapted_trained = trained.adapt(None, _support(x))
    assert torch.equal(
        predict(loaded, x, params=adapted_loaded), predict(trained, x, params=adapted_trained)
    )


def test_predict_runs_the_module_with_the_given_parameters(trained: MetaLearner) -> None:
    x = torch.linspace(-5, 5, 7).unsqueeze(1)  # float32: moved to the learner's float64
    meta = {n: p.detach() for n, p in trained.meta_params["default_policy"].items()}
    model = build_model(trained.config.modules["default_policy"]).double()
    reference = functional_call(model, meta, (x.double(),))
    before = predict(trained, x)
    assert before.dtype == torch.float64 and not before.requires_grad
    assert torch.equal(before, reference)

    adapted = trained.adapt(None, _support(x.double()))
    after = predict(trained, x, params=adapted)
    assert torch.equal(after, functional_call(model, adapted["default_policy"], (x.double(),)))
    target = 2 * torch.sin(x.double())
    assert (after - target).square().mean() < (before - target).square().mean()

    obs = torch.zeros(3, 2)
    gaussian = predict(trained, obs, module_id="critic")
    assert sorted(gaussian) == ["log_std", "mean"]
    assert gaussian["mean"].shape == (3, 2)


def test_predict_names_unknown_modules(trained: MetaLearner) -> None:
    x = torch.zeros(2, 1)
    with pytest.raises(KeyError) as caught:
        predict(trained, x, module_id="policy")
    assert caught.value.args[0] == (
        "module 'policy' is not one of the learner's modules ['default_policy', 'critic']"
    )
    with pytest.raises(KeyError) as caught:
        predict(trained, x, params={"critic": {}})
    assert caught.value.args[0] == (
        "params hold no module 'default_policy' (they hold ['critic']); pass the result of "
        "learner.adapt(...) or None for the meta-parameters"
    )


def test_a_version_without_learner_state_is_refused_by_name(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store", durable=False)
    store.publish(
        "bare", {"default_policy": {"w": torch.ones(2)}}, metrics={}, config={}, lineage={}
    )
    with pytest.raises(ArtifactNotFoundError) as caught:
        load_learner("bare:1", root=tmp_path / "store")
    assert str(caught.value) == (
        f"bare:1 in {tmp_path / 'store'} holds no learner state (no {LEARNER_TENSORS}, "
        f"{LEARNER_JSON}; files: config.json, metrics.json, params.safetensors); it was not "
        "published with learner_state_files(...): load its parameters with "
        "ArtifactStore.load_params"
    )


def test_importing_the_consumer_loads_neither_ray_nor_prefect() -> None:
    probe = (
        "import sys, pipeline.consumer; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'prefect'}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")
