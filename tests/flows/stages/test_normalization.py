"""``data.normalize: [obs]``: the training data's statistics become each module's
``input_stats`` (``flows.stages.normalization``), the network standardises raw observations
itself (``learners.models.factory.Standardize``), and a published learner carries them to
a consumer in another process; a version published without them still loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from flows.config import load_config
from flows.stages.datasets import inspect_datasets
from flows.stages.normalization import learner_config
from learners import MetaLearner
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import LEARNER_JSON, learner_state_files, load_learner, predict
from tests.helpers.fresh_python import fresh_python
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(300)

POINT_ROBOT = REPO / "flows" / "configs" / "point_robot.yaml"
MODULE = "default_policy"
TOLERANCE = 64 * torch.finfo(torch.float64).eps  # values of order 1 through a 40-40 MLP


@pytest.fixture(scope="module")
def configs():
    cfg = load_config(POINT_ROBOT, ["data.normalize=[obs]", "learners.dtype=float64"])
    train, _ = inspect_datasets(cfg)
    return learner_config(cfg, train), cfg.learners.meta_config(), train.values.stats["obs"]


def _meta_batch(shift: torch.Tensor, scale: torch.Tensor) -> dict:
    """Raw observations (``x * scale + shift`` of unit-scale ``x``) and their actions."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4, 10, 2, generator=generator, dtype=torch.float64)
    actions = torch.tanh(x @ torch.tensor([[1.0, -0.5], [0.3, 0.8]], dtype=torch.float64))
    raw = x * scale + shift
    return {
        part: {MODULE: {"obs": raw[:, rows], "actions": actions[:, rows]}}
        for part, rows in (("support", slice(0, 5)), ("query", slice(5, 10)))
    }


def _standardized(meta_batch: dict, mean: torch.Tensor, std: torch.Tensor) -> dict:
    return {
        part: {MODULE: {**batch[MODULE], "obs": (batch[MODULE]["obs"] - mean) / std}}
        for part, batch in meta_batch.items()
    }


def _stats(found) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(torch.tensor(v, dtype=torch.float64) for v in (found.mean, found.std))


def test_the_statistics_of_the_training_data_reach_every_module(configs) -> None:
    normalized, plain, found = configs
    assert plain.modules[MODULE].input_stats is None
    stats = normalized.modules[MODULE].input_stats
    assert (stats.mean, stats.std) == (found.mean, found.std)


def test_training_on_raw_observations_is_training_on_standardised_ones(configs) -> None:
    normalized, plain, found = configs
    mean, std = _stats(found)
    raw = _meta_batch(mean, std)
    with_stats, without = MetaLearner(normalized), MetaLearner(plain)
    for _ in range(2):
        with_stats.step(raw)
        without.step(_standardized(raw, mean, std))
    for name, tensor in with_stats.get_state()["params"][MODULE].items():
        expected = without.get_state()["params"][MODULE][name]
        torch.testing.assert_close(tensor, expected, rtol=0, atol=TOLERANCE)
    support = raw["support"][MODULE]
    obs = raw["query"][MODULE]["obs"][0]
    adapted = with_stats.adapt(None, {MODULE: {k: v[0] for k, v in support.items()}})
    standardized = {k: v[0] for k, v in _standardized(raw, mean, std)["support"][MODULE].items()}
    torch.testing.assert_close(
        predict(with_stats, obs, params=adapted),
        predict(without, (obs - mean) / std, params=without.adapt(None, {MODULE: standardized})),
        rtol=0,
        atol=TOLERANCE,
    )


def _publish(root: Path, learner: MetaLearner, edit=None) -> None:
    state = learner.get_state()
    files = dict(learner_state_files(state))
    if edit is not None:
        files[LEARNER_JSON] = edit(files[LEARNER_JSON])
    ArtifactStore(root, durable=False).publish(
        "robot",
        state["params"],
        metrics={},
        config=learner.config,
        lineage={},
        files=list(files.items()),
    )


def test_a_consumer_in_a_fresh_process_passes_raw_observations(configs, tmp_path) -> None:
    normalized, _, found = configs
    mean, std = _stats(found)
    raw = _meta_batch(mean, std)
    trained = MetaLearner(normalized)
    trained.step(raw)
    _publish(tmp_path, trained)
    support = {k: v[1].tolist() for k, v in raw["support"][MODULE].items()}
    obs = raw["query"][MODULE]["obs"][1]
    printed, stats_there = predicted_in_a_fresh_process(
        tmp_path, MODULE, support, obs, f"learner.config.modules[{MODULE!r}].input_stats.mean"
    )
    adapted = trained.adapt(None, {MODULE: {k: v[1] for k, v in raw["support"][MODULE].items()}})
    expected = predict(trained, obs, params=adapted)
    found_there = torch.tensor(json.loads(printed), dtype=torch.float64)
    torch.testing.assert_close(found_there, expected, rtol=0, atol=TOLERANCE)
    assert json.loads(stats_there) == list(found.mean)


def predicted_in_a_fresh_process(
    root: Path, module: str, support: dict[str, list], obs: torch.Tensor, *also: str
) -> list[str]:
    """What a consumer in a fresh process prints: ``robot@latest`` from the store at ``root``,
    adapted on ``support`` (raw columns, float64), its prediction for ``obs`` (a dict of
    outputs for a head that gives several) as JSON, then each expression of ``also``."""
    return fresh_python(
        "import json, torch\n"
        "from pipeline.consumer import load_learner, predict\n"
        f"learner = load_learner('robot@latest', root={str(root)!r})\n"
        f"support = {{k: torch.tensor(v, dtype=torch.float64) for k, v in {support!r}.items()}}\n"
        f"adapted = learner.adapt(None, {{{module!r}: support}})\n"
        f"obs = torch.tensor({obs.tolist()!r}, dtype=torch.float64)\n"
        "out = predict(learner, obs, params=adapted)\n"
        "out = {k: v.tolist() for k, v in out.items()} if isinstance(out, dict) else out.tolist()\n"
        "print(json.dumps(out))\n" + "".join(f"print(json.dumps({e}))\n" for e in also)
    ).splitlines()


def _without_input_stats(json_bytes: bytes) -> bytes:
    """The learner state as a version published before ``input_stats`` existed holds it."""

    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "input_stats"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    text = json.loads(json_bytes)
    assert "input_stats" in json.dumps(text)
    return json.dumps(strip(text)).encode()


def test_a_version_published_without_statistics_still_loads(configs, tmp_path) -> None:
    _, plain, _ = configs
    learner = MetaLearner(plain)
    _publish(tmp_path, learner, edit=_without_input_stats)
    loaded = load_learner("robot@latest", root=tmp_path)
    assert loaded.config.modules[MODULE].input_stats is None
    obs = torch.randn(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(predict(loaded, obs), predict(learner, obs))
