"""MetaLearner: meta-gradients against finite differences, vmap against the loop, first-order
against a hand-written reference, several modules, evaluation and adaptation, non-finite
handling and the meta-batch boundary."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from learners import MetaConfig, MetaLearner, NonFiniteGradientError
from tests.helpers.references import FD_STEP, central_differences
from tests.helpers.references import reference_mse as _mse
from tests.helpers.tolerances import largest, rounding_tolerance, trajectory_tolerance

F64 = torch.float64
# Rounded operations along the longest chain behind one loss or meta-gradient of these tests
# (at most 3 inner steps on nets of at most 1-8-8-1 units over at most 6 rows): an inner step
# is about 100 (the forward pass, its loss and its backward pass, each a few dot products of
# at most 8 terms and a mean over the rows, then the update), the query loss as many again,
# and the second-order backward pass retraces every step: 2 * (3 + 1) * 100 = 800 < 1,000.
_OPS = 1_000


def _config(**overrides) -> dict:
    module = {
        "obs_dim": 1,
        "action_dim": 1,
        "model": {"hidden_sizes": [8, 8], "activation": "tanh"},
    }
    config = {"modules": {"m": module}, "dtype": "float64", "inner": {"lr": 0.1}}
    config.update(overrides)
    return config


def _meta_batch(tasks=4, k=5, q=6, seed=0, mids=("m",), obs_dim=1, act_dim=1, dtype=F64):
    g = torch.Generator().manual_seed(seed)

    def part(rows):
        return {
            mid: {
                "obs": torch.rand(tasks, rows, obs_dim, generator=g, dtype=dtype) * 4 - 2,
                "actions": torch.randn(tasks, rows, act_dim, generator=g, dtype=dtype),
            }
            for mid in mids
        }

    return {"support": part(k), "query": part(q)}


def _finite_difference(learner: MetaLearner, meta_batch, leaf: torch.Tensor, steps: int):
    return central_differences(lambda: learner.evaluate(meta_batch, steps=(steps,))[steps], leaf)


@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("algorithm", ["maml", "metasgd"])
def test_meta_gradient_matches_finite_differences_in_float64(algorithm, steps):
    config = _config(algorithm=algorithm, inner={"lr": 0.1, "steps": steps})
    config["modules"]["m"]["model"]["hidden_sizes"] = [6]
    learner = MetaLearner(config)
    with torch.no_grad():  # learning rates that differ per element exercise Meta-SGD fully
        for log_lr in learner.log_lrs.values():
            log_lr.add_(0.3 * torch.randn(log_lr.shape, dtype=F64))
    meta_batch = _meta_batch(tasks=3)
    grads, metrics = learner.compute_meta_gradients(meta_batch)
    pairs = [(learner.meta_params["m"][n], g) for n, g in grads.params["m"].items()]
    pairs += [(learner.log_lrs[k], g) for k, g in grads.log_lrs.items()]
    assert len(pairs) == (8 if algorithm == "metasgd" else 4)
    # A central difference errs by the rounding of its two losses divided by the step 2h,
    # plus h^2/6 times the third derivative (below 1e-12 times it here, negligible); the
    # analytic gradient's own rounding is smaller still.
    loss = float(metrics["query_loss"])
    atol = rounding_tolerance(F64, magnitude=loss, ops=_OPS) / (2 * FD_STEP)
    for leaf, analytic in pairs:
        numeric = _finite_difference(learner, meta_batch, leaf, steps)
        torch.testing.assert_close(analytic, numeric, rtol=0, atol=atol)


@pytest.mark.parametrize(
    "overrides",
    [
        {"algorithm": "maml"},
        {"algorithm": "fomaml"},
        {"algorithm": "metasgd", "inner": {"lr": 0.05, "steps": 2}},
        {"inner": {"optimizer": "adam", "steps": 3, "clip_norm": 0.5}},
        {"inner": {"optimizer": "momentum", "steps": 2, "nonfinite": "skip"}},
    ],
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_vmap_equals_the_per_task_loop(overrides, dtype):
    config = {**_config(dtype=str(dtype).removeprefix("torch.")), **overrides}
    vmapped, looped = MetaLearner(config), MetaLearner({**config, "vectorize": "loop"})
    meta_batch = _meta_batch(tasks=5, dtype=dtype)
    grads_v, metrics_v = vmapped.compute_meta_gradients(meta_batch)
    grads_l, metrics_l = looped.compute_meta_gradients(meta_batch)
    # The two paths batch and sum the same operations differently, so they differ by rounding
    # alone, scaled by the largest loss or gradient (about 1 here): under 1e-12 in float64,
    # 1e-4 of that scale in float32.
    losses = ("query_loss", "support_loss_before", "support_loss_after")
    magnitude = largest([*grads_v.tensors(), *map(metrics_v.get, losses)])
    atol = rounding_tolerance(dtype, magnitude=magnitude, ops=_OPS)
    assert dtype != F64 or atol <= 1e-10
    for a, b in zip(grads_v.tensors(), grads_l.tensors(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)
    for key in losses:
        torch.testing.assert_close(metrics_v[key], metrics_l[key], rtol=0, atol=atol)
    assert vmapped.evaluate(meta_batch, (0, 2)) == pytest.approx(
        looped.evaluate(meta_batch, (0, 2)), rel=0, abs=atol
    )


def test_first_order_equals_second_order_with_detached_inner_gradients():
    learner = MetaLearner(_config(algorithm="fomaml", inner={"lr": 0.1, "steps": 2}))
    meta_batch = _meta_batch()
    grads, _ = learner.compute_meta_gradients(meta_batch)
    model = learner._models["m"]
    leaves = {n: p.detach().clone().requires_grad_() for n, p in learner.meta_params["m"].items()}
    support, query = meta_batch["support"]["m"], meta_batch["query"]["m"]
    tasks = support["obs"].shape[0]
    for i in range(tasks):
        params = dict(leaves)
        for _ in range(2):
            outputs = torch.func.functional_call(model, params, (support["obs"][i],))
            loss = _mse(outputs, {"actions": support["actions"][i]})
            inner = torch.autograd.grad(loss, list(params.values()))  # no create_graph
            params = {n: p - 0.1 * g for (n, p), g in zip(params.items(), inner, strict=True)}
        outputs = torch.func.functional_call(model, params, (query["obs"][i],))
        (_mse(outputs, {"actions": query["actions"][i]}) / tasks).backward()
    atol = rounding_tolerance(
        F64, magnitude=largest(leaf.grad for leaf in leaves.values()), ops=_OPS
    )
    for name, leaf in leaves.items():
        torch.testing.assert_close(grads.params["m"][name], leaf.grad, rtol=0, atol=atol)


def _two_models():
    torch.manual_seed(3)
    return {mid: nn.Sequential(nn.Linear(1, 5), nn.Tanh(), nn.Linear(5, 1)) for mid in "ab"}


def test_two_modules_each_get_their_own_meta_gradients():
    models = _two_models()
    spec = {"obs_dim": 1, "action_dim": 1}
    joint = MetaLearner(_config(modules={"a": spec, "b": spec}), models=models)
    meta_batch = _meta_batch(mids=("a", "b"))
    grads, metrics = joint.compute_meta_gradients(meta_batch)
    assert {"a/query_loss", "b/query_loss"} <= set(metrics)
    for mid in "ab":
        alone = MetaLearner(_config(modules={mid: spec}), models={mid: models[mid]})
        single = {part: {mid: batch[mid]} for part, batch in meta_batch.items()}
        expected, _ = alone.compute_meta_gradients(single)
        atol = rounding_tolerance(F64, magnitude=largest(expected.tensors()), ops=_OPS)
        for name, g in expected.params[mid].items():
            torch.testing.assert_close(grads.params[mid][name], g, rtol=0, atol=atol)


def test_modules_to_update_freezes_the_others():
    models = _two_models()
    spec = {"obs_dim": 1, "action_dim": 1}
    learner = MetaLearner(
        _config(modules={"a": spec, "b": spec}, modules_to_update=["a"]), models=models
    )
    frozen = {n: p.clone() for n, p in learner.meta_params["b"].items()}
    learner.step(_meta_batch(mids=("a", "b")))
    assert all(torch.equal(learner.meta_params["b"][n], p) for n, p in frozen.items())
    assert set(learner.get_state()["params"]) == {"a", "b"}


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(1, 1)
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, obs):
        return self.used(obs)


def test_an_unused_parameter_is_neither_updated_nor_a_crash_and_the_module_stays_intact():
    model = _WithUnused()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    learner = MetaLearner(_config(inner={"optimizer": "adam"}), models={"m": model})
    for seed in range(3):
        metrics = learner.step(_meta_batch(seed=seed))
    assert metrics["weights_seq_no"] == 3
    assert torch.equal(learner.meta_params["m"]["unused"], torch.ones(3, dtype=F64))
    assert not torch.equal(learner.meta_params["m"]["used.weight"], before["used.weight"].double())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_compute_then_apply_equals_step_and_averaged_shards_equal_the_whole():
    stepped, split = MetaLearner(_config()), MetaLearner(_config())
    meta_batch = _meta_batch(tasks=6)
    stepped.step(meta_batch)
    halves = [
        {
            p: {m: {c: t[s] for c, t in cols.items()} for m, cols in b.items()}
            for p, b in meta_batch.items()
        }
        for s in (slice(0, 3), slice(3, 6))
    ]
    shard_grads = [split.compute_meta_gradients(h)[0] for h in halves]
    averaged = [
        (a + b) / 2 for a, b in zip(shard_grads[0].tensors(), shard_grads[1].tensors(), strict=True)
    ]
    rebuilt = type(shard_grads[0])(
        {"m": dict(zip(split.meta_params["m"], averaged, strict=True))}, {}
    )
    split.apply_meta_gradients(rebuilt)
    # One outer Adam step from gradients that differ by rounding (two means of 3 averaged
    # against one mean of 6).
    atol = trajectory_tolerance(
        F64,
        steps=1,
        step_size=stepped.config.outer.lr,
        params_magnitude=largest(stepped.meta_params["m"].values()),
        ops=_OPS,
    )
    for name, p in stepped.meta_params["m"].items():
        torch.testing.assert_close(split.meta_params["m"][name], p, rtol=0, atol=atol)
    assert split.weights_seq_no == stepped.weights_seq_no == 1


def test_adapt_and_evaluate_use_the_training_inner_rule_without_touching_meta_params():
    learner = MetaLearner(_config(algorithm="metasgd", inner={"lr": 0.1, "steps": 2}))
    meta_batch = _meta_batch(tasks=1)
    trained_objective = float(learner.compute_meta_gradients(meta_batch)[1]["query_loss"])
    for leaf in learner._leaves:
        leaf.grad = None
    curve = learner.evaluate(meta_batch, steps=(0, 2, 4))
    atol = rounding_tolerance(F64, magnitude=largest(curve.values()), ops=_OPS)
    assert curve[2] == pytest.approx(trained_objective, rel=0, abs=atol)
    support = {"m": {c: t[0] for c, t in meta_batch["support"]["m"].items()}}
    query = {"m": {c: t[0] for c, t in meta_batch["query"]["m"].items()}}
    for steps in (2, 4):
        adapted = learner.adapt(None, support, steps=steps)
        outputs = torch.func.functional_call(
            learner._models["m"], adapted["m"], (query["m"]["obs"],)
        )
        assert float(_mse(outputs, query["m"])) == pytest.approx(curve[steps], rel=0, abs=atol)
        assert all(p.grad_fn is None for p in adapted["m"].values())
    assert all(leaf.grad is None for leaf in learner._leaves)
    unchanged = learner.adapt(None, support, steps=0)
    assert all(torch.equal(unchanged["m"][n], p) for n, p in learner.meta_params["m"].items())
    with pytest.raises(ValueError, match=r"steps must be non-negative integers, got \[-1\]"):
        learner.evaluate(meta_batch, steps=(-1,))


def test_step_reports_and_logs_metrics():
    learner = MetaLearner(_config(algorithm="metasgd"))
    metrics = learner.step(_meta_batch())
    assert set(metrics) == {
        "query_loss",
        "support_loss_before",
        "support_loss_after",
        "inner_nonfinite_tasks",
        "num_tasks",
        "grad_norm",
        "outer_skipped",
        "inner_lr_mean",
        "inner_lr_min",
        "inner_lr_max",
        "weights_seq_no",
    }
    assert float(metrics["support_loss_after"]) < float(metrics["support_loss_before"])
    reduced = learner.metrics.reduce()
    assert reduced["num_tasks_trained_lifetime"] == 4.0
    assert reduced["query_loss"] == float(metrics["query_loss"])  # the mean of one value


def _nan_in(meta_batch, part):
    meta_batch[part]["m"]["actions"][1, 0, 0] = float("nan")
    return meta_batch


def _snapshot(learner):
    state = learner.get_state()
    return state["params"], state["optimizer"]["state"]


def _assert_unchanged(learner, snapshot):
    params, optimizer = snapshot
    assert all(torch.equal(learner.meta_params["m"][n], p) for n, p in params["m"].items())
    live = learner._optimizer.state_dict()["state"]
    assert live.keys() == optimizer.keys()
    for index, slots in optimizer.items():
        assert all(torch.equal(live[index][name], t) for name, t in slots.items())


def test_inner_nonfinite_error_halts_the_learner_and_is_raised_at_the_next_check():
    learner = MetaLearner(_config())
    learner.step(_meta_batch(seed=1))
    good = learner.get_state()
    snapshot = _snapshot(learner)
    learner.step(_nan_in(_meta_batch(), "support"))  # never waits for the device
    learner.step(_meta_batch(seed=2))  # a halted learner changes nothing
    message = (
        "non-finite inner gradient for module 'm': met in 1 of 4 tasks at weights_seq_no 1; "
        "lower inner.lr, set inner.clip_norm, or choose inner.nonfinite 'skip' or 'zero'"
    )
    for check in (learner.check_finite, learner.check_finite, learner.get_state):
        with pytest.raises(NonFiniteGradientError) as error:
            check()
        assert str(error.value) == message
    assert learner.weights_seq_no == 1
    _assert_unchanged(learner, snapshot)
    learner.set_state(good)  # a loaded state clears the failure
    learner.check_finite()
    learner.step(_meta_batch(seed=2))
    assert learner.weights_seq_no == 2


def test_the_per_task_loop_raises_an_inner_nonfinite_error_at_once():
    learner = MetaLearner(_config(vectorize="loop"))
    snapshot = _snapshot(learner)
    with pytest.raises(NonFiniteGradientError) as error:
        learner.step(_nan_in(_meta_batch(), "support"))
    assert str(error.value).startswith(
        "non-finite inner gradient for module 'm': the updated parameters are non-finite;"
    )
    assert learner.weights_seq_no == 0
    _assert_unchanged(learner, snapshot)


def test_evaluate_reports_a_nonfinite_inner_step_under_vmap_as_training_does():
    batch = _nan_in(_meta_batch(), "support")
    with pytest.raises(NonFiniteGradientError) as error:
        MetaLearner(_config()).evaluate_tasks(batch, steps=(0, 1, 3))
    assert str(error.value) == (
        "non-finite inner gradient for module 'm': met in 1 of 4 tasks adapting for evaluate "
        "(steps [0, 1, 3]); lower inner.lr, set inner.clip_norm, or choose inner.nonfinite "
        "'skip' or 'zero'"
    )
    with pytest.raises(NonFiniteGradientError, match="the updated parameters are non-finite"):
        MetaLearner(_config(vectorize="loop")).evaluate_tasks(batch, steps=(0, 1, 3))
    for policy in ("skip", "zero"):  # these policies step on, under vmap as in the loop
        curves = [
            MetaLearner(
                _config(vectorize=v, inner={"lr": 0.1, "nonfinite": policy})
            ).evaluate_tasks(_nan_in(_meta_batch(), "support"), steps=(1,))[1]
            for v in ("vmap", "loop")
        ]
        tol = _OPS * torch.finfo(F64).eps * float(curves[1].abs().max())
        torch.testing.assert_close(curves[0], curves[1], rtol=0, atol=tol)


def test_outer_nonfinite_policies():
    meta_batch = _nan_in(_meta_batch(), "query")
    raising = MetaLearner(_config())
    raising.step(_meta_batch(seed=1))
    snapshot = _snapshot(raising)
    raising.step(meta_batch)
    with pytest.raises(NonFiniteGradientError) as error:
        raising.check_finite()
    assert str(error.value) == (
        "non-finite meta-gradient (norm nan) at weights_seq_no 1; set outer.clip_norm, lower "
        "the learning rates, or choose outer.nonfinite='skip'"
    )
    assert raising.weights_seq_no == 1
    _assert_unchanged(raising, snapshot)
    skipping = MetaLearner(_config(outer={"nonfinite": "skip"}))
    skipping.step(_meta_batch(seed=1))
    snapshot = _snapshot(skipping)
    metrics = skipping.step(meta_batch)
    assert metrics["outer_skipped"] == 1 and metrics["weights_seq_no"] == 1
    skipping.check_finite()  # skipping is no failure
    _assert_unchanged(skipping, snapshot)
    metrics = skipping.step(_meta_batch())
    assert metrics["outer_skipped"] == 0 and skipping.weights_seq_no == 2
    assert skipping.metrics.reduce()["outer_skipped"] == 1


def test_meta_batches_are_checked_at_the_boundary():
    learner = MetaLearner(_config())
    good = _meta_batch()
    with pytest.raises(ValueError) as error:
        learner.step({"support": good["support"]})
    assert str(error.value) == "a meta-batch needs 'support' and 'query', it has ['support']"
    uneven = _meta_batch()
    uneven["query"]["m"]["actions"] = uneven["query"]["m"]["actions"][:3]
    with pytest.raises(
        ValueError, match=r"same number of tasks .*\"query\['m'\]\['actions'\]\": 3"
    ):
        learner.step(uneven)
    flat = _meta_batch()
    flat["support"]["m"]["obs"] = torch.zeros(4)
    with pytest.raises(TypeError) as error:
        learner.step(flat)
    assert (
        str(error.value)
        == "support['m']['obs'] must be a tensor shaped [tasks, rows, ...], got (4,)"
    )
    with pytest.raises(ValueError, match=r"none of the trained \['m'\]"):
        learner.step(_meta_batch(mids=("other",)))


def test_config_is_accepted_as_a_dict_or_a_model():
    assert MetaLearner(MetaConfig(**_config())).config == MetaLearner(_config()).config


def test_user_models_must_match_the_configured_modules():
    with pytest.raises(ValueError) as error:
        MetaLearner(_config(), models=_two_models())
    assert str(error.value) == "models ['a', 'b'] must match config.modules ['m']"
