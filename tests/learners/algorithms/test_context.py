"""The context learner (learners.algorithms.context): an encoder of the support transitions
gives a task latent that conditions the policy (and a value function, and a task model).

The reference below writes each network, the pooling with the prior, the losses and the mean
over tasks by hand, one task at a time, and takes the meta-gradient with `torch.autograd`.
"""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from learners import MetaConfig, MetaLearner
from learners.models.spec import InputStats
from pipeline.consumer import predict
from tests.helpers.tolerances import largest, rounding_tolerance

F64 = torch.float64
POLICY, ENCODER, VALUE, MODEL = "default_policy", "encoder", "value", "task_model"
OBS, ACT, LATENT = 2, 2, 3
M, K, Q = 3, 4, 5
# Rounded operations along the longest chain behind one meta-gradient here (nets of at most
# 7-5-4 units over at most 5 rows; the encoder's codes summed over 4 rows; a loss over 5 rows
# and the mean over 3 tasks; backward retraces all of it): about 2 * 150 = 300 < 500.
_OPS = 500


def _config(rl: bool = False, **overrides) -> dict:
    tanh = {"hidden_sizes": [5], "activation": "tanh"}
    modules = {
        POLICY: {"obs_dim": OBS, "action_dim": ACT, "model": dict(tanh)},
        ENCODER: {"obs_dim": 2 * OBS + ACT + 1, "action_dim": LATENT, "model": dict(tanh)},
    }
    context: dict = {"latent_dim": LATENT}
    if rl:
        modules[POLICY]["model"]["head"] = "gaussian"
        modules[VALUE] = {"obs_dim": OBS, "action_dim": 1, "model": dict(tanh)}
        modules[MODEL] = {"obs_dim": OBS + ACT, "action_dim": 1 + OBS, "model": dict(tanh)}
        context |= {"value": VALUE, "task_model": MODEL, "task_model_coef": 0.5}
        context |= {"action_std": 0.5}
    config = {"algorithm": "context", "context": context, "modules": modules, "dtype": "float64"}
    config.update(overrides)
    return config


def _part(rows: int, generator: torch.Generator) -> dict:
    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(M, rows, *shape, generator=generator, dtype=F64)

    columns = {"obs": draw(OBS), "actions": draw(ACT), "rewards": draw(), "new_obs": draw(OBS)}
    return {POLICY: columns | {"returns": draw()}}


def _meta_batch(seed: int = 0) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {"support": _part(K, generator), "query": _part(Q, generator)}


def _mlp(p: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    hidden = torch.tanh(x @ p[f"{prefix}layers.0.weight"].T + p[f"{prefix}layers.0.bias"])
    return hidden @ p[f"{prefix}layers.2.weight"].T + p[f"{prefix}layers.2.bias"]


def _reference_task_loss(params: dict, support: dict, query: dict, rl: bool) -> torch.Tensor:
    """One task's meta-objective, written out: latent = (prior + sum of codes) / (K + 1)."""
    s, q = support[POLICY], query[POLICY]
    transitions = torch.cat([s["obs"], s["actions"], s["rewards"][:, None], s["new_obs"]], 1)
    codes = _mlp(params[ENCODER], "", transitions)

    def latent(module: str) -> torch.Tensor:
        pooled = (params[module]["latent"] + codes.sum(0)) / (codes.shape[0] + 1)
        return pooled.expand(q["obs"].shape[0], -1)

    policy_in = torch.cat([q["obs"], latent(POLICY)], 1)
    prefix = "network.mean." if rl else "network."
    mean = _mlp(params[POLICY], prefix, policy_in)
    if not rl:
        return (mean - q["actions"]).square().mean()
    value = _mlp(params[VALUE], "network.", torch.cat([q["obs"], latent(VALUE)], 1))[:, 0]
    advantages = (q["returns"] - value).detach()
    standard = (advantages - advantages.mean()) / (advantages.std() + torch.finfo(F64).eps)
    weights = torch.exp(torch.clamp(standard / 1.0, max=math.log(20.0)))
    std = 0.5
    nll = 0.5 * ((q["actions"] - mean) / std) ** 2 + math.log(std) + 0.5 * math.log(2 * math.pi)
    policy_loss = (weights * nll.sum(1)).mean()
    value_loss = (value - q["returns"]).square().mean()
    model_in = torch.cat([q["obs"], q["actions"], latent(MODEL)], 1)
    predicted = _mlp(params[MODEL], "network.", model_in)
    target = torch.cat([q["rewards"][:, None], q["new_obs"]], 1)
    return policy_loss + value_loss + 0.5 * (predicted - target).square().mean()


def _reference_gradients(learner: MetaLearner, meta_batch: dict, rl: bool) -> dict:
    params = {
        m: {n: p.detach().clone().requires_grad_(True) for n, p in named.items()}
        for m, named in learner.meta_params.items()
    }
    total = 0
    for task in range(M):
        support = {
            m: {c: t[task] for c, t in cols.items()} for m, cols in meta_batch["support"].items()
        }
        query = {
            m: {c: t[task] for c, t in cols.items()} for m, cols in meta_batch["query"].items()
        }
        total = total + _reference_task_loss(params, support, query, rl) / M
    leaves = [p for named in params.values() for p in named.values()]
    grads = torch.autograd.grad(total, leaves, allow_unused=True)
    flat = [torch.zeros_like(p) if g is None else g for p, g in zip(leaves, grads, strict=True)]
    return {"loss": total.detach(), "grads": flat}


def _assert_meta_gradients_match(config: dict, rl: bool) -> None:
    meta_batch = _meta_batch()
    learner = MetaLearner(config)
    # The priors start at zeros: move them so that their gradient path is exercised too.
    with torch.no_grad():
        for named in learner.meta_params.values():
            if "latent" in named:
                named["latent"].copy_(torch.linspace(-0.5, 0.5, LATENT, dtype=F64))
    grads, metrics = learner.compute_meta_gradients(meta_batch)
    reference = _reference_gradients(learner, meta_batch, rl)
    found = grads.tensors()
    magnitude = largest([*reference["grads"], reference["loss"], *_all(meta_batch)])
    tolerance = rounding_tolerance(F64, magnitude=max(magnitude, 1.0), ops=_OPS)
    assert len(found) == len(reference["grads"])
    for got, want in zip(found, reference["grads"], strict=True):
        assert torch.allclose(got, want, rtol=0, atol=tolerance)
    assert abs(float(metrics["query_loss"]) - float(reference["loss"])) <= tolerance
    assert any(float(g.abs().max()) > 0 for g in found[:4])  # the encoder gets a gradient


def _all(meta_batch: dict) -> list[torch.Tensor]:
    return [t for part in meta_batch.values() for cols in part.values() for t in cols.values()]


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
@pytest.mark.parametrize("rl", [False, True], ids=["imitation", "value"])
def test_meta_gradients_match_a_per_task_loop_written_by_hand(rl: bool, vectorize: str) -> None:
    _assert_meta_gradients_match(_config(rl, vectorize=vectorize), rl)


def test_adapt_gives_the_prior_for_no_context_and_a_latent_independent_of_order() -> None:
    learner = MetaLearner(_config())
    support = {
        m: {c: t[0] for c, t in cols.items()} for m, cols in _meta_batch()["support"].items()
    }
    prior = learner.meta_params[POLICY]["latent"]
    assert torch.equal(learner.adapt(None, support, steps=0)[POLICY]["latent"], prior)
    adapted = learner.adapt(None, support)
    shuffled = {POLICY: {c: t.flip(0) for c, t in support[POLICY].items()}}
    flipped = learner.adapt(None, shuffled)
    tolerance = rounding_tolerance(F64, magnitude=largest(_all(_meta_batch())), ops=_OPS)
    assert torch.allclose(adapted[POLICY]["latent"], flipped[POLICY]["latent"], atol=tolerance)
    assert not torch.allclose(adapted[POLICY]["latent"], prior)
    # Only the latent changes; predict runs the adapted policy with nothing new.
    same = [n for n in adapted[POLICY] if n != "latent"]
    assert all(torch.equal(adapted[POLICY][n], learner.meta_params[POLICY][n]) for n in same)
    obs = torch.randn(6, OBS, dtype=F64)
    before, after = predict(learner, obs), predict(learner, obs, params=adapted)
    assert before.shape == after.shape == (6, ACT) and not torch.allclose(before, after)


def test_a_state_saved_and_loaded_continues_exactly() -> None:
    learner = MetaLearner(_config(True))
    learner.step(_meta_batch(0))
    resumed = MetaLearner.from_state(learner.get_state())
    for learner_ in (learner, resumed):
        learner_.step(_meta_batch(1))
    for module, named in learner.meta_params.items():
        for name, p in named.items():
            assert torch.equal(resumed.meta_params[module][name], p)


def _refusal(config: dict) -> str:
    with pytest.raises(ValidationError) as caught:
        MetaConfig.model_validate(config)
    (error,) = caught.value.errors()
    return error["msg"]


def test_bad_context_configs_are_refused_with_what_was_expected() -> None:
    wrong_width = _config()
    wrong_width["modules"][ENCODER]["obs_dim"] = 5
    assert _refusal(wrong_width) == (
        "Value error, algorithm 'context': the encoder needs obs_dim 7 and action_dim 3, "
        "got 5 and 3"
    )
    extra = _config()
    extra["modules"]["critic"] = {"obs_dim": OBS, "action_dim": 1}
    assert _refusal(extra) == (
        "Value error, algorithm 'context' needs one module per role {'policy': "
        "'default_policy', 'encoder': 'encoder'}; modules has ['critic', 'default_policy', "
        "'encoder']: name each module in the context section, once"
    )
    assert _refusal(_config(inner={"learned_lr": "scalar"})) == (
        "Value error, algorithm 'context' needs inner.learned_lr in ['none'], got 'scalar'; "
        "the context learner adapts by encoding, without inner learning rates"
    )
    assert _refusal({**_config(), "algorithm": "maml"}) == (
        "Value error, the context section applies to algorithm 'context', not 'maml'; drop it "
        "or set algorithm: context"
    )
    categorical = _config()
    categorical["modules"][POLICY]["model"]["head"] = "categorical"
    categorical["modules"][POLICY]["loss"] = "cross_entropy"
    assert _refusal(categorical) == (
        "Value error, algorithm 'context' encodes continuous actions; the policy has head "
        "'categorical': drop 'actions' from context.fields"
    )


def test_normalised_observations_reach_the_encoder_inside_its_transitions() -> None:
    obs = InputStats(mean=tuple(float(i) for i in range(OBS)), std=(2.0,) * OBS)
    assert set(MetaConfig.model_validate(_config(True)).input_stats(obs)) == {POLICY, VALUE}
    asked = _config(True)
    asked["context"]["standardize_transitions"] = True
    config = MetaConfig.model_validate(asked)
    stats = config.input_stats(obs)
    assert set(stats) == {POLICY, ENCODER, VALUE}  # the task model reads [obs, action]
    assert stats[POLICY] == stats[VALUE] == obs
    # fields obs, actions, rewards, new_obs: the actions and the reward pass unchanged.
    unchanged = (0.0,) * (ACT + 1), (1.0,) * (ACT + 1)
    assert stats[ENCODER].mean == obs.mean + unchanged[0] + obs.mean
    assert stats[ENCODER].std == obs.std + unchanged[1] + obs.std
    encoder = config.modules[ENCODER].model_copy(update={"input_stats": stats[ENCODER]})
    learner = MetaLearner(
        config.model_copy(update={"modules": {**config.modules, ENCODER: encoder}})
    )
    support = {c: t[0] for c, t in _part(K, torch.Generator())[POLICY].items()}
    adapted = learner.adapt(None, {POLICY: support})
    assert torch.isfinite(adapted[POLICY]["latent"]).all()


def test_the_config_fixes_latents_and_the_rows_each_module_reads() -> None:
    config = MetaConfig.model_validate(_config(True))
    assert [config.modules[m].latent_dim for m in (POLICY, ENCODER, VALUE, MODEL)] == [3, 0, 3, 3]
    assert [config.modules[m].data_module for m in (ENCODER, VALUE, MODEL)] == [POLICY] * 3
    assert config.data_modules == [POLICY] and config.rollout_module == POLICY
    assert config.observing_modules == [POLICY, VALUE]
    assert config.sample_columns == ("obs", "actions", "rewards", "new_obs", "returns")
    assert MetaConfig.model_validate(config.model_dump(mode="json")) == config
