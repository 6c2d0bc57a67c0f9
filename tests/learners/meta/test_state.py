"""MetaLearner state: exact resume from a checkpoint alone, and no autograd graph outliving a
meta-step."""

from __future__ import annotations

import contextlib
import gc
import io
from collections.abc import Iterator

import pytest
import torch

from learners import MetaLearner
from learners.meta.graph_memory import saved_tensor_bytes


def _config(**overrides) -> dict:
    module = {"obs_dim": 2, "action_dim": 1, "model": {"hidden_sizes": [16, 16]}}
    return {"modules": {"m": module}, "inner": {"lr": 0.05}, **overrides}


def _meta_batches(count: int, tasks: int = 5, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)

    def part(rows):
        return {
            "m": {
                "obs": torch.randn(tasks, rows, 2, generator=g),
                "actions": torch.randn(tasks, rows, 1, generator=g),
            }
        }

    return [{"support": part(8), "query": part(8)} for _ in range(count)]


def _roundtrip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "overrides",
    [
        {"algorithm": "metasgd", "inner": {"lr": 0.05, "steps": 2}},
        {"algorithm": "maml", "inner": {"optimizer": "adam", "lr": 0.01}, "vectorize": "loop"},
        {"algorithm": "fomaml", "outer": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9}},
    ],
)
def test_resume_from_a_checkpoint_alone_reproduces_an_uninterrupted_run(overrides):
    batches = _meta_batches(8)
    straight = MetaLearner(_config(**overrides))
    for batch in batches:
        straight.step(batch)

    first = MetaLearner(_config(**overrides))
    for batch in batches[:4]:
        first.step(batch)
    state = _roundtrip(first.get_state())
    del first
    resumed = MetaLearner.from_state(state)
    for batch in batches[4:]:
        resumed.step(batch)

    assert resumed.weights_seq_no == straight.weights_seq_no == 8
    for name, p in straight.meta_params["m"].items():
        assert torch.equal(resumed.meta_params["m"][name], p), name
    for key, log_lr in straight.log_lrs.items():
        assert torch.equal(resumed.log_lrs[key], log_lr), key
    reduced, expected = resumed.metrics.reduce(), straight.metrics.reduce()
    assert reduced["num_tasks_trained_lifetime"] == expected["num_tasks_trained_lifetime"] == 40
    # The same losses (bit-identical parameters give them) averaged in the same order.
    assert reduced["query_loss"] == expected["query_loss"]


def test_the_state_is_a_snapshot_and_carries_the_config():
    learner = MetaLearner(_config(algorithm="metasgd"))
    state = learner.get_state()
    learner.step(_meta_batches(1)[0])
    rebuilt = MetaLearner.from_state(state)
    assert rebuilt.weights_seq_no == 0
    assert rebuilt.config == learner.config
    assert state["config"]["inner"]["learned_lr"] == "element"
    assert not torch.equal(
        rebuilt.meta_params["m"]["layers.0.weight"], learner.meta_params["m"]["layers.0.weight"]
    )


def test_set_state_refuses_a_state_from_another_config():
    state = MetaLearner(_config()).get_state()
    other = MetaLearner(_config(seed=1, vectorize="loop"))
    with pytest.raises(ValueError) as error:
        other.set_state(state)
    assert (
        str(error.value)
        == "the state was saved with a different config (differs in ['seed', 'vectorize'])"
    )
    with pytest.raises(ValueError, match="learner state format None, expected 1"):
        other.set_state({})


@contextlib.contextmanager
def _objects_made_from_here() -> Iterator[None]:
    """Let ``gc`` see only the objects made inside the block: everything older (the session's
    millions of Ray, Prefect and test objects) is frozen out of its collections and of
    ``gc.get_objects()``, which otherwise took 2-3 s a scan once the whole suite had run."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _live_graph_tensors() -> list[torch.Tensor]:
    """The tensors with an autograd graph (``grad_fn``) that are alive, among the objects
    made inside ``_objects_made_from_here``."""
    gc.collect()
    return [
        o for o in gc.get_objects() if issubclass(type(o), torch.Tensor) and o.grad_fn is not None
    ]


def test_saved_bytes_sees_a_live_graph():
    with _objects_made_from_here():
        x = torch.randn(100, requires_grad=True)
        y = (x * x).sum()
        assert saved_tensor_bytes([y]) >= 400
        assert any(t is y for t in _live_graph_tensors())


@pytest.mark.parametrize("vectorize", ["vmap", "loop"])
@pytest.mark.parametrize("algorithm", ["maml", "metasgd"])
def test_no_graph_outlives_a_meta_step(algorithm, vectorize):
    # The learner and its batches are made inside the block, so every tensor a step could
    # leave behind (new, or one of the learner's own given a graph) is among those scanned.
    with _objects_made_from_here():
        learner = MetaLearner(
            _config(algorithm=algorithm, vectorize=vectorize, inner={"lr": 0.05, "steps": 3})
        )
        batches = _meta_batches(3)
        baseline = _live_graph_tensors()
        held = []
        for batch in batches:
            held.append(learner.step(batch))  # keeping the returned metrics must not keep a graph
            live = _live_graph_tensors()
            assert len(live) == len(baseline)
            assert saved_tensor_bytes(live) == saved_tensor_bytes(baseline) == 0
        learner.evaluate(batches[0], steps=(0, 2))
        learner.adapt(None, {"m": {c: t[0] for c, t in batches[0]["support"]["m"].items()}})
        assert len(_live_graph_tensors()) == len(baseline)
