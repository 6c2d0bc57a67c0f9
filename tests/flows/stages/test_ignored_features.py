"""``data.ignore_obs_features``: every module reads the named observation features as 0,
the policy's observations and the observation parts of an encoder's transitions, with or
without standardisation; bad indices are refused in one line."""

from __future__ import annotations

import pytest
import torch

from flows.config import ConfigError, load_config
from flows.stages.datasets import inspect_datasets
from flows.stages.normalization import learner_config
from learners import MetaLearner
from pipeline.consumer import predict
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(300)

REACH = REPO / "flows" / "configs" / "metaworld_reach.yaml"
POLICY, ENCODER = "default_policy", "encoder"
OBJECT = [*range(4, 18), *range(22, 36)]
# One transition of the encoder: obs 39, action 4, reward 1, next obs 39.
NEXT_OBS = 44


def _config(*overrides: str):
    cfg = load_config(REACH, ["learners.compile=off", *overrides])
    train, _ = inspect_datasets(cfg)
    return learner_config(cfg, train), train.values.stats["obs"]


@pytest.fixture(scope="module")
def ignoring():
    return _config("data.ignore_obs_features=['4:18', '22:36']")


def test_the_policy_and_the_encoder_ignore_the_features(ignoring) -> None:
    config, found = ignoring
    policy = config.modules[POLICY].input_stats
    assert (policy.mean, policy.std, policy.ignored) == (found.mean, found.std, tuple(OBJECT))
    # The shipped encoder reads raw transitions: mean 0, std 1, the features still ignored
    # in both observations of a transition.
    encoder = config.modules[ENCODER].input_stats
    assert (set(encoder.mean), set(encoder.std)) == ({0.0}, {1.0})
    assert encoder.ignored == (*OBJECT, *(NEXT_OBS + i for i in OBJECT))
    standardized, _ = _config(
        "data.ignore_obs_features=[5]", "learners.context.standardize_transitions=true"
    )
    encoder = standardized.modules[ENCODER].input_stats
    assert encoder.mean[:39] == found.mean and encoder.ignored == (5, NEXT_OBS + 5)


def _meta_batch(generator: torch.Generator) -> dict:
    def part(rows: int) -> dict:
        obs = torch.randn(3, rows, 39, generator=generator)
        return {
            POLICY: {
                "obs": obs,
                "actions": torch.randn(3, rows, 4, generator=generator).clamp(-1, 1),
                "rewards": torch.randn(3, rows, generator=generator),
                "new_obs": obs + 0.01 * torch.randn(3, rows, 39, generator=generator),
            }
        }

    return {"support": part(50), "query": part(50)}


def _scrambled(meta_batch: dict) -> dict:
    """The same meta-batch with every ignored feature replaced: large values, inf, NaN."""
    out = {}
    for part, modules in meta_batch.items():
        batch = dict(modules[POLICY])
        for name in ("obs", "new_obs"):
            tensor = batch[name].clone()
            tensor[..., OBJECT] = 1e6
            tensor[..., 4] = float("nan")
            tensor[..., 22] = float("inf")
            batch[name] = tensor
        out[part] = {POLICY: batch}
    return out


def test_training_and_adapting_do_not_read_the_ignored_features(ignoring) -> None:
    config, _ = ignoring
    recorded = _meta_batch(torch.Generator().manual_seed(0))
    scrambled = _scrambled(recorded)
    learners = MetaLearner(config), MetaLearner(config)
    for _ in range(2):
        learners[0].step(recorded)
        learners[1].step(scrambled)
    trained = [learner.get_state()["params"] for learner in learners]
    for module, params in trained[0].items():
        for name, tensor in params.items():
            assert torch.equal(tensor, trained[1][module][name]), (module, name)
    support = [
        {POLICY: {k: v[0] for k, v in b["support"][POLICY].items()}} for b in (recorded, scrambled)
    ]
    obs = [b["query"][POLICY]["obs"][0] for b in (recorded, scrambled)]
    acted = [
        predict(learner, o, params=learner.adapt(None, s))
        for learner, o, s in zip(learners, obs, support, strict=True)
    ]
    assert torch.equal(acted[0], acted[1])
    # Not vacuous: the features kept do matter.
    moved = obs[0].clone()
    moved[..., 0] += 1.0
    assert not torch.equal(
        predict(learners[0], moved, params=learners[0].adapt(None, support[0])), acted[0]
    )


@pytest.mark.parametrize(
    ("value", "line"),
    [
        (
            "['5:5']",
            "data.ignore_obs_features: range '5:5' is empty; expected 'a:b' with a < b",
        ),
        (
            "[3, 3]",
            "data.ignore_obs_features: expected distinct feature indices >= 0, got [3, 3]",
        ),
        (
            "[-1]",
            "data.ignore_obs_features: expected distinct feature indices >= 0, got [-1]",
        ),
    ],
)
def test_malformed_features_are_refused_naming_the_key(value: str, line: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(REACH, [f"data.ignore_obs_features={value}"])
    assert str(caught.value) == f"invalid config {REACH} (1 error):\n  {line}"


def test_a_feature_outside_the_observation_is_refused() -> None:
    with pytest.raises(ValueError) as caught:
        _config("data.ignore_obs_features=[4, 39]")
    assert str(caught.value) == (
        "data.ignore_obs_features: feature 39 is outside module 'default_policy''s observation "
        "of 39 features"
    )
