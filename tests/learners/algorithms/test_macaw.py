"""MACAW: its losses against hand-written formulas, the inner phases (value first, then the
policy with the adapted value function), the meta-gradient against finite differences in
float64 with learned learning rates, vmap against the loop, exact resume, and its config."""

from __future__ import annotations

import io
import math

import pytest
import torch
from pydantic import ValidationError

from learners import MetaConfig, MetaLearner, ModuleCall, build_models, params_from_modules
from learners.algorithms.macaw_config import MacawConfig, resolve_macaw
from learners.algorithms.macaw_losses import (
    AdvantageWeightedRegression,
    advantage_weights,
    value_regression_loss,
)
from tests.helpers.references import FD_STEP, central_differences
from tests.helpers.tolerances import largest, rounding_tolerance

F64 = torch.float64
POLICY, VALUE = "default_policy", "value"
# Rounded operations along the longest chain behind one loss or meta-gradient here (at most 2
# inner steps of two phases on nets of at most 2-4-4-2 units over at most 6 rows): a phase's
# step is about 150 (forward passes of both modules, the weights' mean, std and exp, the loss,
# its backward, the update), the query losses as many again, and the second-order backward
# retraces every step: 2 * (2 * 2 + 1) * 150 = 1,500 < 2,000.
_OPS = 2_000


def _config(**overrides) -> dict:
    config = {
        "algorithm": "macaw",
        "modules": {
            POLICY: {
                "obs_dim": 2,
                "action_dim": 2,
                "model": {
                    "hidden_sizes": [4],
                    "activation": "tanh",
                    "head": "mean_advantage",
                    "advantage_hidden_sizes": [3],
                },
            },
            VALUE: {
                "obs_dim": 2,
                "action_dim": 1,
                "model": {"hidden_sizes": [4], "activation": "tanh"},
            },
        },
        "dtype": "float64",
        "inner": {"lr": 0.1},
        "macaw": {"action_std": 0.5},
    }
    config.update(overrides)
    return config


def _meta_batch(tasks=3, k=6, q=5, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)

    def part(rows):
        return {
            POLICY: {
                "obs": torch.randn(tasks, rows, 2, generator=g, dtype=dtype),
                "actions": torch.randn(tasks, rows, 2, generator=g, dtype=dtype) * 0.5,
                "returns": torch.randn(tasks, rows, generator=g, dtype=dtype) * 2 - 1,
            }
        }

    return {"support": part(k), "query": part(q)}


def test_value_regression_and_awr_match_their_formulas():
    learner = MetaLearner(_config(macaw={"action_std": 0.5, "temperature": 2.0}))
    params = learner.meta_params
    columns = {k: v[0] for k, v in _meta_batch()["support"][POLICY].items()}
    models = learner._models
    obs, actions, returns = columns["obs"], columns["actions"], columns["returns"]

    def call(module_id):
        return ModuleCall(module_id, models, params, {})

    values = torch.func.functional_call(models[VALUE], params[VALUE], (obs,))[:, 0]
    expected_value = (values - returns).square().mean()
    assert torch.equal(value_regression_loss(call(VALUE), columns), expected_value)

    out = torch.func.functional_call(models[POLICY], params[POLICY], (obs, actions))
    advantages = (returns - values).detach()
    z = (advantages - advantages.mean()) / advantages.std()
    weights = torch.exp(torch.clamp(z / 2.0, max=math.log(20.0)))
    log_prob = torch.distributions.Normal(out["mean"], 0.5).log_prob(actions).sum(-1)
    head = (out["advantage"][:, 0] - advantages).square().mean()
    expected = -(weights * log_prob).mean() + 0.01 * head
    loss = AdvantageWeightedRegression(VALUE, 2.0, 20.0, True, 0.5, 0.01)(call(POLICY), columns)
    # Two float64 formulas of about 40 operations per row over 6 rows, on values of about 5.
    atol = rounding_tolerance(F64, magnitude=largest([log_prob, weights]) * 6, ops=100)
    torch.testing.assert_close(loss, expected, rtol=0, atol=atol)
    # The advantages are constants: no gradient reaches the value module through the weights.
    (grad_value,) = torch.autograd.grad(
        AdvantageWeightedRegression(VALUE, 2.0, 20.0, True, 0.5, 0.0)(call(POLICY), columns),
        params[VALUE]["layers.0.weight"],
        allow_unused=True,
    )
    assert grad_value is None


def test_weights_are_clipped_and_finite_when_every_advantage_is_equal():
    advantages = torch.tensor([0.0, 1.0, 2.0, 100.0], dtype=F64)
    raw = advantage_weights(advantages, temperature=0.5, max_weight=20.0, normalize=False)
    assert raw.tolist() == pytest.approx([1.0, math.exp(2.0), 20.0, 20.0], rel=1e-15)
    flat = advantage_weights(
        torch.full((5,), 3.0), temperature=1.0, max_weight=20.0, normalize=True
    )
    assert flat.tolist() == [1.0] * 5


def test_the_policy_phase_sees_the_value_function_the_value_phase_adapted():
    learner = MetaLearner(_config())
    support = {k: v[0] for k, v in _meta_batch()["support"][POLICY].items()}
    rule = learner._rule
    params = learner.meta_params
    expanded = rule.expand({POLICY: support})
    assert expanded[VALUE] is expanded[POLICY]
    adapted, _ = rule.adapt(params, expanded, lrs=None)
    value_phase, policy_phase = rule.phases
    after_value = value_phase.update(params, expanded).params
    assert all(torch.equal(after_value[POLICY][n], p) for n, p in params[POLICY].items())
    # The policy phase from the adapted value function, by hand.
    by_hand = policy_phase.update(after_value, expanded).params
    for module_id in (POLICY, VALUE):
        for name, tensor in by_hand[module_id].items():
            assert torch.equal(adapted[module_id][name], tensor), (module_id, name)
    stale = policy_phase.update(params, expanded).params  # with the unadapted value function
    assert not torch.equal(stale[POLICY]["mean.weight"], adapted[POLICY]["mean.weight"])


def _objective(learner: MetaLearner, meta_batch, module_id: str) -> float:
    _, metrics = learner.compute_meta_gradients(meta_batch)
    return float(metrics[f"{module_id}/query_loss"])


def _finite_difference(learner, meta_batch, leaf, module_id):
    return central_differences(lambda: _objective(learner, meta_batch, module_id), leaf)


@pytest.mark.parametrize("steps", [1, 2])
def test_meta_gradient_matches_finite_differences_in_float64(steps):
    """MACAW's meta-gradient treats the advantage weights as constants (the paper computes
    them without gradient). The policy's leaves see the weights only as data, so their
    gradient is the full derivative of the policy's query loss; the value function's leaves
    move the weights too, which the gradient ignores by design, so theirs is the derivative
    of the value's own query loss."""
    learner = MetaLearner(_config(inner={"lr": 0.1, "steps": steps}))
    with torch.no_grad():  # learning rates that differ per tensor exercise the learned rates
        for log_lr in learner.log_lrs.values():
            log_lr.add_(0.3 * torch.randn(log_lr.shape, dtype=F64))
    meta_batch = _meta_batch()
    grads, metrics = learner.compute_meta_gradients(meta_batch)
    assert len(grads.log_lrs) == 12  # per tensor: 8 of the policy, 4 of the value function
    for module_id in (POLICY, VALUE):
        pairs = [(learner.meta_params[module_id][n], g) for n, g in grads.params[module_id].items()]
        pairs += [
            (learner.log_lrs[k], g) for k, g in grads.log_lrs.items() if k.startswith(module_id)
        ]
        # A central difference errs by the rounding of its two losses over the step 2h, plus
        # h^2/6 times the third derivative (negligible at h = 1e-6).
        loss = abs(float(metrics[f"{module_id}/query_loss"]))
        atol = rounding_tolerance(F64, magnitude=loss, ops=_OPS) / (2 * FD_STEP)
        for leaf, analytic in pairs:
            numeric = _finite_difference(learner, meta_batch, leaf, module_id)
            torch.testing.assert_close(analytic, numeric, rtol=0, atol=atol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_vmap_equals_the_per_task_loop(dtype):
    config = _config(dtype=str(dtype).removeprefix("torch."), inner={"lr": 0.1, "steps": 2})
    vmapped, looped = MetaLearner(config), MetaLearner({**config, "vectorize": "loop"})
    meta_batch = _meta_batch(tasks=4, dtype=dtype)
    grads_v, metrics_v = vmapped.compute_meta_gradients(meta_batch)
    grads_l, metrics_l = looped.compute_meta_gradients(meta_batch)
    # Batched and per-task arithmetic differ by rounding alone, scaled by the largest loss or
    # gradient.
    losses = ("query_loss", "support_loss_before", "support_loss_after")
    magnitude = largest([*grads_v.tensors(), *(metrics_v[k].abs() for k in losses)])
    atol = rounding_tolerance(dtype, magnitude=magnitude, ops=_OPS)
    assert dtype != F64 or atol <= 1e-10
    for a, b in zip(grads_v.tensors(), grads_l.tensors(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    for key in losses:
        torch.testing.assert_close(metrics_v[key], metrics_l[key], rtol=0, atol=atol)
    curve_v = vmapped.evaluate(meta_batch, steps=(0, 1, 2))
    curve_l = looped.evaluate(meta_batch, steps=(0, 1, 2))
    assert curve_v == pytest.approx(curve_l, rel=0, abs=atol)


def test_resume_from_a_checkpoint_alone_reproduces_an_uninterrupted_run():
    config = _config(dtype="float32")
    batches = [_meta_batch(seed=s, dtype=torch.float32) for s in range(6)]
    straight = MetaLearner(config)
    for batch in batches:
        straight.step(batch)
    first = MetaLearner(config)
    for batch in batches[:3]:
        first.step(batch)
    buffer = io.BytesIO()
    torch.save(first.get_state(), buffer)
    buffer.seek(0)
    resumed = MetaLearner.from_state(torch.load(buffer, weights_only=True))
    for batch in batches[3:]:
        resumed.step(batch)
    assert resumed.weights_seq_no == straight.weights_seq_no == 6
    for module_id in (POLICY, VALUE):
        for name, p in straight.meta_params[module_id].items():
            assert torch.equal(resumed.meta_params[module_id][name], p), (module_id, name)
    for key, log_lr in straight.log_lrs.items():
        assert torch.equal(resumed.log_lrs[key], log_lr), key
    assert resumed.metrics.reduce()["query_loss"] == straight.metrics.reduce()["query_loss"]


def test_defaults_are_the_authors_and_every_value_is_a_field():
    config = MetaConfig.model_validate(_config(inner={}, macaw={}))
    assert config.inner.lr == 1e-3 and config.inner.steps == 1
    assert config.inner.learned_lr == "tensor" and config.inner.first_order is False
    assert (config.outer.lr, config.outer.module_lr, config.outer.log_lr_lr) == (
        1e-4,
        {VALUE: 1e-5},
        1e-3,
    )
    macaw = config.macaw
    assert (macaw.temperature, macaw.max_weight, macaw.action_std) == (1.0, 20.0, 0.2)
    assert macaw.advantage_head_coef == 0.01 and macaw.normalize_advantages is True
    assert config.modules[VALUE].data_module == POLICY
    assert config.data_modules == [POLICY]
    # A config that states its own values keeps them, and survives a round trip.
    own = MetaConfig.model_validate(_config(outer={"lr": 0.01}))
    assert own.outer.lr == 0.01 and own.outer.module_lr == {VALUE: 1e-5}
    assert MetaConfig.model_validate(own.model_dump(mode="json")) == own
    learner = MetaLearner(_config())
    groups = [(g["lr"], len(g["params"])) for g in learner._optimizer.param_groups]
    assert groups == [(1e-4, 8), (1e-5, 4), (1e-3, 12)]


def test_resolving_macaw_returns_new_values_and_changes_nothing_it_was_given():
    plain = MetaConfig.model_validate(_config(algorithm="maml", macaw=None))
    modules = dict(plain.modules)
    before = {m: spec.model_copy() for m, spec in modules.items()}
    given = {"inner": frozenset(), "outer": frozenset({"lr"})}
    resolved = resolve_macaw(None, modules, None, given)
    assert modules == before and plain.modules[VALUE].data_module is None
    assert resolved.modules[VALUE].data_module == POLICY
    assert resolved.macaw == MacawConfig()
    assert resolved.inner == {"lr": 1e-3}
    assert resolved.outer == {"log_lr_lr": 1e-3, "module_lr": {VALUE: 1e-5}}


def _error(config: dict) -> str:
    with pytest.raises(ValidationError) as error:
        MetaConfig.model_validate(config)
    return error.value.errors()[0]["msg"].removeprefix("Value error, ")


def test_bad_macaw_configs_are_refused_with_what_was_expected():
    config = _config()
    del config["modules"][VALUE]
    assert _error(config) == (
        "algorithm 'macaw' needs two modules, a policy and a value function (macaw.policy "
        "'default_policy', macaw.value 'value'); modules has ['default_policy'], missing: "
        "'value' (value)"
    )
    config = _config()
    config["modules"][POLICY]["model"]["head"] = "deterministic"
    assert _error(config) == (
        "algorithm 'macaw': the policy module 'default_policy' has head 'deterministic'; "
        "expected head 'mean_advantage'"
    )
    config = _config()
    config["modules"][VALUE]["action_dim"] = 2
    assert _error(config) == (
        "algorithm 'macaw': the value module 'value' must output one number (action_dim 1, "
        "head 'deterministic'), got action_dim 2, head 'deterministic'"
    )
    config = _config()
    config["modules"][POLICY]["loss"] = "losses.mine:awr"
    assert _error(config) == (
        "algorithm 'macaw' sets the losses of its modules itself (value regression to returns, "
        "advantage-weighted regression); got losses {'default_policy': 'losses.mine:awr'}: "
        "drop them"
    )
    assert _error({**_config(), "algorithm": "maml"}) == (
        "the macaw section applies to algorithm 'macaw', not 'maml'; drop it or set "
        "algorithm: macaw"
    )
    config = _config(algorithm="maml", macaw=None)
    config["modules"][VALUE]["data_module"] = VALUE
    assert _error(config) == (
        "module 'value' has data_module 'value'; expected another module of "
        "['default_policy', 'value'] that reads its own rows"
    )


def test_a_meta_batch_without_returns_is_refused_naming_the_column():
    learner = MetaLearner(_config())
    meta_batch = _meta_batch()
    for part in meta_batch.values():
        del part[POLICY]["returns"]
    with pytest.raises(ValueError) as error:
        learner.step(meta_batch)
    assert str(error.value) == (
        "module 'value': the batch has columns ['actions', 'obs'], expected 'returns'"
    )


def test_models_give_the_policy_an_advantage_head_only_when_actions_are_given():
    config = MetaConfig.model_validate(_config())
    model = build_models(config.modules, seed=0)[POLICY]
    obs, actions = torch.randn(3, 2), torch.randn(3, 2)
    assert set(model(obs)) == {"mean"}
    out = model(obs, actions)
    assert out["mean"].shape == (3, 2) and out["advantage"].shape == (3, 1)
    names = set(params_from_modules(model)["default_policy"])
    assert {"mean.weight", "advantage.layers.0.weight", "trunk.0.weight"} <= names
