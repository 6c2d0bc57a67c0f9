"""The training loop measures `support_loss_after` only on the steps a metrics read will see,
and every read (log lines, history points, checkpoints' saved windows) holds exactly what it
would if every step measured it."""

from __future__ import annotations

import torch

from learners import MetaLearner, run_meta_training
from learners.metrics import MetricsLogger
from tests.learners.meta.test_learner import _config, _meta_batch


class _MeasuringEveryStep(MetaLearner):
    """The reference: every step measures support_loss_after, whatever the loop asks."""

    def step(self, meta_batch, *, support_loss_after=True):
        return super().step(meta_batch, support_loss_after=True)


def _run(learner_type: type[MetaLearner]) -> tuple[list, dict, list, int]:
    # A window shorter than the gaps between reads, so that some steps are never read.
    learner = learner_type(_config(), metrics=MetricsLogger(window=3))
    logs, windows = [], []

    def on_checkpoint(iteration: int, history: dict) -> None:
        stats = learner.metrics.get_state()["stats"]
        windows.append((iteration, {key: stat["values"] for key, stat in stats.items()}))

    history = run_meta_training(
        learner,
        [_meta_batch(seed=i) for i in range(23)],
        start=0,
        stop=23,
        log_every=10,
        checkpoint_every=8,
        history_every=9,
        on_log=lambda iteration, reduced: logs.append((iteration, _timeless(reduced))),
        on_checkpoint=on_checkpoint,
    )
    measured = learner.metrics.get_state()["stats"]["support_loss_after"]["count"]
    return logs, history, windows, measured


def _timeless(reduced: dict) -> dict:
    return {key: value for key, value in reduced.items() if key != "num_tasks_trained"}


def test_every_read_of_support_loss_after_equals_measuring_every_step():
    logs, history, windows, measured = _run(MetaLearner)
    every_logs, every_history, every_windows, every_measured = _run(_MeasuringEveryStep)
    assert logs == every_logs
    assert history == every_history
    assert windows == every_windows
    assert every_measured == 23
    # Reads at 8, 9, 10, 16, 18, 20 and 23, each seeing the 3 steps up to it.
    assert measured == len({6, 7, 8, 9, 10, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23})


def test_a_step_without_support_loss_after_leaves_only_that_metric_out():
    config = _config(modules={m: {"obs_dim": 1, "action_dim": 1} for m in "ab"})
    measuring, lean = MetaLearner(config), MetaLearner(config)
    meta_batch = _meta_batch(mids=("a", "b"))
    full = measuring.step(meta_batch)
    partial = lean.step(meta_batch, support_loss_after=False)
    assert set(full) - set(partial) == {
        "support_loss_after",
        "a/support_loss_after",
        "b/support_loss_after",
    }
    assert all(torch.equal(torch.as_tensor(partial[k]), torch.as_tensor(full[k])) for k in partial)
    for m, named in measuring.meta_params.items():
        assert all(torch.equal(lean.meta_params[m][n], p) for n, p in named.items())
    assert "support_loss_after" not in lean.metrics.reduce()
