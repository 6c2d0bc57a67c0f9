"""MetricsLogger: each reduction, scopes that never collide, state round trip, and merging
several workers' results."""

from __future__ import annotations

import pytest
import torch

from learners import MetaLearner, MetricsLogger, merge_reduced


def test_each_reduction():
    logger = MetricsLogger(window=3, ema_coeff=0.5)
    for value in (1.0, 2.0, 3.0, 4.0):
        logger.log("loss", value)
        logger.log("smooth", value, reduce="ema")
        logger.log("steps", 1, reduce="sum")
        logger.log("lifetime", value, reduce="lifetime_sum")
    logger.log("loss_tensor", torch.tensor(2.5))
    first = logger.reduce()
    assert first["loss"] == 3.0  # mean of the last 3 values
    assert first["smooth"] == 3.125  # 1 -> 1.5 -> 2.25 -> 3.125
    assert first["steps"] == 4
    assert first["lifetime"] == 10.0
    assert first["loss_tensor"] == 2.5
    logger.log("lifetime", 5.0, reduce="lifetime_sum")
    second = logger.reduce()
    assert second["steps"] == 0  # a period sum restarts after reduce()
    assert second["lifetime"] == 15.0
    assert second["loss"] == 3.0  # the window slides, it is not cleared


def test_a_reduce_without_reset_leaves_the_period_to_the_next_one():
    logger = MetricsLogger(window=3)
    for value in (1.0, 2.0):
        logger.log("steps", 1, reduce="sum")
        logger.log("loss", value)
    assert logger.reduce(reset=False) == {"steps": 2, "loss": 1.5}
    logger.log("steps", 1, reduce="sum")
    assert logger.reduce() == {"steps": 3, "loss": 1.5}  # the whole period since the last reset
    assert logger.reduce()["steps"] == 0


def test_throughput_is_the_period_sum_per_second(monkeypatch):
    clock = iter([100.0, 102.0, 102.0, 103.0, 103.0])
    monkeypatch.setattr("learners.metrics._clock", lambda: next(clock))
    logger = MetricsLogger()
    logger.log("rows", 300, reduce="throughput")  # clock starts at 100
    logger.log("rows", 100, reduce="throughput")
    assert logger.reduce() == {"rows": 200.0}  # 400 rows in 2 s; restarts at 102
    logger.log("rows", 50, reduce="throughput")
    assert logger.reduce() == {"rows": 50.0}


def test_bad_values_and_changed_reductions_are_refused():
    logger = MetricsLogger()
    logger.log("loss", 1.0)
    with pytest.raises(ValueError) as error:
        logger.log("loss", 1.0, reduce="sum")
    assert str(error.value) == "metric 'loss' is reduced with 'mean'; it cannot also use 'sum'"
    with pytest.raises(
        ValueError,
        match=r"metric 'x': expected a float or a one-element tensor, got a tensor of shape \(2,\)",
    ):
        logger.log("x", torch.ones(2))
    with pytest.raises(TypeError, match="metric 'y': expected a number, got str"):
        logger.log("y", "1")
    with pytest.raises(ValueError, match="reduce 'median' is not one of"):
        logger.log("z", 1.0, reduce="median")
    with pytest.raises(KeyError, match="no metric 'nope'; logged: \\['loss'\\]"):
        logger.peek("nope")


def test_log_many_logs_each_value_with_its_reduction_and_leaves_out_none():
    logger = MetricsLogger().scope("learner")
    reductions = {"skipped": "sum", "ignored": None}
    for step in range(3):
        values = {"loss": torch.tensor(float(step)), "skipped": torch.tensor(1), "ignored": 7}
        logger.log_many(values, reductions)
    assert logger.reduce() == {"loss": 1.0, "skipped": 3.0}
    with pytest.raises(ValueError) as error:
        logger.log_many({"loss": 1.0}, {"loss": "sum"})
    assert str(error.value) == "metric 'loss' is reduced with 'mean'; it cannot also use 'sum'"
    with pytest.raises(TypeError, match="metric 'loss': expected a number, got str"):
        logger.log_many({"loss": "1"}, {})


def test_sums_of_tensors_equal_adding_each_value_as_it_comes():
    # float32 values whose sum depends on the order of the additions: the logger adds them
    # when read, in the order logged, across its holding limit and a state round trip.
    g = torch.Generator().manual_seed(0)
    values = torch.rand(700, generator=g) * 10 ** torch.randint(-3, 4, (700,), generator=g)
    logger = MetricsLogger()
    expected: float | torch.Tensor = 0.0
    period: float | torch.Tensor = 0.0
    for index, value in enumerate(values):
        mixed = 1 if index % 2 else value  # Python numbers between tensors keep their turn
        logger.log("total", value, reduce="lifetime_sum")
        logger.log("period", mixed, reduce="sum")
        expected, period = expected + value, period + mixed
        if index == 400:
            resumed = MetricsLogger()
            resumed.set_state(logger.get_state())
            logger = resumed
    assert logger.peek("total") == float(expected)
    assert logger.reduce() == {"total": float(expected), "period": float(period)}


def test_a_window_read_often_gives_the_means_of_its_values_to_the_bit():
    # Tensors and numbers mixed, read every 7 values (values read before are held as floats).
    g = torch.Generator().manual_seed(1)
    values = [v if i % 3 else float(v) for i, v in enumerate(torch.rand(60, generator=g))]
    logger = MetricsLogger(window=20)
    for index, value in enumerate(values):
        logger.log("loss", value)
        if index % 7 == 6 or index == len(values) - 1:
            window = [float(v) for v in values[max(0, index - 19) : index + 1]]
            assert logger.reduce(reset=False)["loss"] == sum(window) / len(window)
    resumed = MetricsLogger(window=20)
    resumed.set_state(logger.get_state())
    assert resumed.peek("loss") == logger.peek("loss")


def test_scopes_never_collide():
    root = MetricsLogger()
    first, second = root.scope("learner_0"), root.scope("learner_1")
    first.log("loss", 1.0)
    second.log("loss", 3.0)
    assert first.reduce() == {"loss": 1.0}
    assert root.reduce() == {"learner_0/loss": 1.0, "learner_1/loss": 3.0}
    with pytest.raises(ValueError) as error:
        root.scope("learner_0")
    assert (
        str(error.value)
        == "metrics scope 'learner_0' is already in use; give each learner its own name"
    )
    with pytest.raises(ValueError, match="must be non-empty and contain no '/'"):
        root.scope("a/b")


def test_two_meta_learners_sharing_a_logger_keep_their_own_metrics():
    root = MetricsLogger()
    config = {"modules": {"m": {"obs_dim": 1, "action_dim": 1}}}
    learners = [MetaLearner(config, metrics=root.scope(f"learner_{i}")) for i in range(2)]
    g = torch.Generator().manual_seed(0)
    for scale, learner in zip((1.0, 100.0), learners, strict=True):
        part = {
            "m": {"obs": torch.randn(2, 4, 1, generator=g), "actions": scale * torch.ones(2, 4, 1)}
        }
        learner.step({"support": part, "query": part})
    reduced = root.reduce()
    assert reduced["learner_1/query_loss"] > 100 * reduced["learner_0/query_loss"]


def test_state_round_trip_keeps_every_statistic():
    logger = MetricsLogger(window=2)
    for value in (1.0, 2.0, 4.0):
        logger.log("loss", torch.tensor(value))
        logger.log("ema", value, reduce="ema")
        logger.log("total", value, reduce="lifetime_sum")
    state = logger.get_state()
    assert state["stats"]["loss"]["values"] == [2.0, 4.0]
    restored = MetricsLogger().scope("x")
    restored.set_state(state)
    assert restored.reduce() == logger.reduce()
    restored.log("loss", 6.0)
    assert restored.peek("loss") == 5.0


def test_merging_workers_sums_sums_and_weights_means_by_count():
    workers = [MetricsLogger(), MetricsLogger()]
    for value in (1.0, 2.0, 3.0):
        workers[0].log("loss", value)
    workers[1].log("loss", 10.0)
    for worker, rows in zip(workers, (30, 70), strict=True):
        worker.log("rows", rows, reduce="sum")
        worker.log("rows_lifetime", rows, reduce="lifetime_sum")
    merged = merge_reduced(w.reduce(with_counts=True) for w in workers)
    assert merged == {"loss": (1 + 2 + 3 + 10) / 4, "rows": 100.0, "rows_lifetime": 100.0}
    clash = MetricsLogger()
    clash.log("loss", 1.0, reduce="sum")
    with pytest.raises(
        ValueError, match="metric 'loss' is reduced with 'mean' by one worker and 'sum' by another"
    ):
        merge_reduced([workers[0].reduce(with_counts=True), clash.reduce(with_counts=True)])
