"""``data.normalize: [obs, rewards, returns]`` on the context learner for offline RL: rewards
and returns are standardised where batches enter the learner (``learners.inner.rule``), the
encoder's and task model's observation parts with the observations' statistics, the task
model's next-observation target too; a consumer passes raw support sets (raw rewards)."""

from __future__ import annotations

import json

import pytest
import torch

from flows.config import load_config
from flows.stages.datasets import inspect_datasets
from flows.stages.normalization import learner_config
from learners import MetaLearner
from pipeline.consumer import load_learner, predict
from tests.flows.stages.test_normalization import (
    TOLERANCE,
    _publish,
    predicted_in_a_fresh_process,
)
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(300)

CONTEXT_RL = REPO / "flows" / "configs" / "point_robot_context_rl.yaml"
POLICY = "default_policy"
F64 = torch.float64


@pytest.fixture(scope="module")
def configs():
    overrides = ["data.normalize=[obs, rewards, returns]", "learners.dtype=float64"]
    cfg = load_config(CONTEXT_RL, overrides)
    train, _ = inspect_datasets(cfg)
    stats = {c: _tensors(train.values.stats[c]) for c in ("obs", "rewards", "returns")}
    return learner_config(cfg, train), cfg.learners.meta_config(), stats


def _tensors(found) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor(found.mean, dtype=F64), torch.tensor(found.std, dtype=F64)


def _raw_meta_batch(stats: dict, seed: int = 0) -> dict:
    """Columns at the scale of the data: unit-scale draws times the std plus the mean."""
    generator = torch.Generator().manual_seed(seed)

    def draw(column: str, *shape: int) -> torch.Tensor:
        mean, std = stats[column]
        return torch.randn(3, 8, *shape, generator=generator, dtype=F64) * std + mean

    def part() -> dict:
        columns = {"obs": draw("obs", 2), "new_obs": draw("obs", 2)}
        columns["actions"] = torch.randn(3, 8, 2, generator=generator, dtype=F64).tanh()
        columns |= {"rewards": draw("rewards", 1)[..., 0], "returns": draw("returns", 1)[..., 0]}
        return {POLICY: columns}

    return {"support": part(), "query": part()}


def _standardized(meta_batch: dict, stats: dict) -> dict:
    sources = {"obs": "obs", "new_obs": "obs", "rewards": "rewards", "returns": "returns"}

    def scaled(name: str, tensor: torch.Tensor) -> torch.Tensor:
        if name not in sources:
            return tensor
        mean, std = stats[sources[name]]
        if tensor.dim() == 2:  # one number per row
            mean, std = mean[0], std[0]
        return (tensor - mean) / std

    return {
        part: {POLICY: {n: scaled(n, t) for n, t in batch[POLICY].items()}}
        for part, batch in meta_batch.items()
    }


def test_every_module_and_column_gets_the_statistics_it_reads(configs) -> None:
    normalized, plain, stats = configs
    obs_mean, obs_std = (tuple(v.tolist()) for v in stats["obs"])
    for module_id in (POLICY, "value"):
        assert normalized.modules[module_id].input_stats.mean == obs_mean
    # The encoder reads [obs, actions, rewards, new_obs]: actions as given, rewards already
    # standardised in the batch.
    encoder = normalized.modules["encoder"].input_stats
    assert encoder.mean == (*obs_mean, 0.0, 0.0, 0.0, *obs_mean)
    assert encoder.std == (*obs_std, 1.0, 1.0, 1.0, *obs_std)
    assert normalized.modules["task_model"].input_stats.std == (*obs_std, 1.0, 1.0)
    assert sorted(normalized.column_stats) == ["returns", "rewards"]
    assert normalized.column_stats["returns"].std == tuple(stats["returns"][1].tolist())
    assert not plain.column_stats and plain.modules["encoder"].input_stats is None


def test_an_encoder_asked_for_raw_transitions_reads_them_raw(configs) -> None:
    _, _, stats = configs
    cfg = load_config(
        CONTEXT_RL, ["data.normalize=[obs]", "learners.context.standardize_transitions=false"]
    )
    train, _ = inspect_datasets(cfg)
    raw = learner_config(cfg, train)
    assert raw.modules["encoder"].input_stats is None
    assert raw.modules[POLICY].input_stats.mean == tuple(stats["obs"][0].tolist())


def test_training_on_raw_columns_is_training_on_standardised_ones(configs) -> None:
    normalized, plain, stats = configs
    raw = _raw_meta_batch(stats)
    with_stats, without = MetaLearner(normalized), MetaLearner(plain)
    for _ in range(2):
        with_stats.step(raw)
        without.step(_standardized(raw, stats))
    for module_id, params in with_stats.get_state()["params"].items():
        for name, tensor in params.items():
            expected = without.get_state()["params"][module_id][name]
            torch.testing.assert_close(tensor, expected, rtol=0, atol=TOLERANCE)


def test_a_consumer_in_a_fresh_process_passes_raw_rewards(configs, tmp_path) -> None:
    normalized, _, stats = configs
    raw = _raw_meta_batch(stats, seed=1)
    trained = MetaLearner(normalized)
    trained.step(raw)
    _publish(tmp_path, trained)
    support = {k: v[1].tolist() for k, v in raw["support"][POLICY].items()}
    obs = raw["query"][POLICY]["obs"][1]
    [printed] = predicted_in_a_fresh_process(tmp_path, POLICY, support, obs)
    adapted = trained.adapt(None, {POLICY: {k: v[1] for k, v in raw["support"][POLICY].items()}})
    expected = predict(trained, obs, params=adapted)["mean"]
    found = torch.tensor(json.loads(printed)["mean"], dtype=F64)
    torch.testing.assert_close(found, expected, rtol=0, atol=TOLERANCE)
    # Raw rewards matter: the same support with standardised rewards gives another latent.
    scaled = _standardized(raw, stats)["support"][POLICY]
    other = trained.adapt(None, {POLICY: {k: v[1] for k, v in scaled.items()}})
    assert not torch.allclose(other[POLICY]["latent"], adapted[POLICY]["latent"])


def _without_column_stats(json_bytes: bytes) -> bytes:
    """The learner state as a version published before ``column_stats`` existed holds it."""
    text = json.loads(json_bytes)
    assert text["state"]["config"].pop("column_stats")
    return json.dumps(text).encode()


def test_a_version_published_without_reward_statistics_still_loads(configs, tmp_path) -> None:
    normalized, _, stats = configs
    _publish(tmp_path, MetaLearner(normalized), edit=_without_column_stats)
    loaded = load_learner("robot@latest", root=tmp_path)
    assert loaded.config.column_stats == {}
    as_before = MetaLearner(normalized.model_copy(update={"column_stats": {}}))
    support = {POLICY: {k: v[0] for k, v in _raw_meta_batch(stats)["support"][POLICY].items()}}
    found, expected = loaded.adapt(None, support), as_before.adapt(None, support)
    assert torch.equal(found[POLICY]["latent"], expected[POLICY]["latent"])
