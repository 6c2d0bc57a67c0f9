"""Checkpoints: lossless safetensors + JSON round trips, atomic directories, exact resume."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from learners.meta.learner import MetaLearner
from learners.training.loop import run_meta_training
from pipeline.io.checkpoints import (
    CheckpointError,
    decode_state,
    dump_state,
    encode_state,
    latest_checkpoint,
    load_checkpoint,
    parse_state,
    read_shard,
    save_checkpoint,
    shard_files,
    shard_ranks,
    write_shard,
)

CONFIG = {
    "modules": {"default_policy": {"obs_dim": 2, "action_dim": 2, "model": {"hidden_sizes": [8]}}},
    "inner": {"lr": 0.3},
}


def _meta_batches(count: int, seed: int = 0) -> list[dict]:
    generator = torch.Generator().manual_seed(seed)

    def part(rows: int) -> dict:
        obs = torch.randn(3, rows, 2, generator=generator)
        return {"default_policy": {"obs": obs, "actions": 0.1 * torch.tanh(obs)}}

    return [{"support": part(4), "query": part(4)} for _ in range(count)]


def _assert_same(left: object, right: object, where: str = "state") -> None:
    assert type(left) is type(right), where
    if isinstance(left, torch.Tensor):
        assert left.dtype == right.dtype and torch.equal(left, right), where
    elif isinstance(left, dict):
        assert list(left) == list(right), where
        for key in left:
            _assert_same(left[key], right[key], f"{where}[{key!r}]")
    elif isinstance(left, list | tuple):
        assert len(left) == len(right), where
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            _assert_same(a, b, f"{where}[{index}]")
    elif isinstance(left, float) and math.isnan(left):
        assert math.isnan(right), where
    else:
        assert left == right, where


def test_a_learner_state_round_trips_exactly_without_pickle() -> None:
    learner = MetaLearner({**CONFIG, "algorithm": "metasgd"})
    for batch in _meta_batches(2):
        learner.step(batch)
    state = learner.get_state()
    tensor_bytes, json_bytes = dump_state(state)
    document = json.loads(json_bytes)
    # Optimizer state is keyed by parameter index (ints) and Adam's betas are a tuple.
    assert "__dict__" in document["state"]["optimizer"]["state"]
    assert document["state"]["optimizer"]["param_groups"][0]["betas"] == {"__tuple__": [0.9, 0.999]}
    _assert_same(parse_state(tensor_bytes, json_bytes), state)


def test_special_values_round_trip_and_unsupported_ones_are_named() -> None:
    state = {
        "nan": float("nan"),
        "inf": float("-inf"),
        "ints": {3: "three", 1: (1, 2)},
        "tagged": {"__tensor__": "not a reference"},
        "empty": torch.zeros(0),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }
    document, tensors = encode_state(state)
    _assert_same(decode_state(json.loads(json.dumps(document)), tensors), state)
    with pytest.raises(CheckpointError) as caught:
        encode_state({"learner": {"sets": {1, 2}}})
    assert str(caught.value) == (
        "state['learner']['sets'] is a set; checkpoints hold tensors, numbers, strings, None, "
        "lists, tuples and dicts"
    )
    with pytest.raises(CheckpointError) as caught:
        encode_state({"opt": {1.5: 0}})
    assert str(caught.value) == (
        "state['opt'] has the key 1.5 (float); checkpoint keys must be strings or ints"
    )


def test_checkpoints_are_whole_directories_the_newest_wins_and_old_ones_go(
    tmp_path: Path,
) -> None:
    assert latest_checkpoint(tmp_path / "none") is None
    for step in (4, 8, 12):
        save_checkpoint(tmp_path, step, {"step": step, "w": torch.full((2,), float(step))}, keep=2)
    # A writer that died before its rename leaves only a temporary directory behind.
    (tmp_path / ".tmp-00000016-1-abcd").mkdir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt")) == [
        "ckpt-00000008",
        "ckpt-00000012",
    ]
    newest = latest_checkpoint(tmp_path)
    assert newest == tmp_path / "ckpt-00000012"
    assert sorted(p.name for p in newest.iterdir()) == ["learner-0.json", "learner-0.safetensors"]
    checkpoint = load_checkpoint(newest)
    assert checkpoint.step == 12
    assert checkpoint.state["step"] == 12
    assert torch.equal(checkpoint.state["w"], torch.full((2,), 12.0))
    # Saving a step again replaces it.
    save_checkpoint(tmp_path, 12, {"step": "again"})
    assert load_checkpoint(newest).state == {"step": "again"}


def test_a_checkpoint_holds_one_shard_per_learner(tmp_path: Path) -> None:
    # What Ray Train merges from its workers: each writes its own shard into one directory.
    for rank in (1, 0, 10):
        write_shard(
            tmp_path, rank, {"rank": rank, "w": torch.full((2,), float(rank))}, durable=False
        )
    assert shard_files(10) == ("learner-10.safetensors", "learner-10.json")
    assert shard_ranks(tmp_path) == [0, 1, 10]
    shard = read_shard(tmp_path, 10)
    assert shard["rank"] == 10 and torch.equal(shard["w"], torch.full((2,), 10.0))
    with pytest.raises(CheckpointError) as caught:
        read_shard(tmp_path, 2)
    assert str(caught.value) == (
        f"checkpoint {tmp_path}: cannot read {tmp_path / 'learner-2.safetensors'}: "
        "No such file or directory"
    )


def test_reading_something_else_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path} is not a checkpoint directory (expected ckpt-NNNNNNNN)"
    )
    broken = tmp_path / "ckpt-00000003"
    broken.mkdir()
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(broken)
    assert str(caught.value) == (
        f"checkpoint {broken}: cannot read {broken / 'learner-0.safetensors'}: "
        "No such file or directory"
    )
    with pytest.raises(CheckpointError) as caught:
        decode_state({"format": 99, "state": {}}, {})
    assert str(caught.value) == "state: format 99 is not checkpoint format 1"


def test_training_resumed_from_a_checkpoint_ends_where_an_uninterrupted_run_ends(
    tmp_path: Path,
) -> None:
    batches = _meta_batches(10)
    settings = {"stop": 10, "log_every": 3, "checkpoint_every": 4, "history_every": 2}

    straight = MetaLearner(CONFIG)
    straight_history = run_meta_training(straight, batches, start=0, **settings)

    first = MetaLearner(CONFIG)

    def save(iteration: int, history: dict) -> None:
        save_checkpoint(tmp_path, iteration, {"learner": first.get_state(), "history": history})
        if iteration == 4:
            raise RuntimeError("crash after the first checkpoint")

    with pytest.raises(RuntimeError):
        run_meta_training(first, batches, start=0, on_checkpoint=save, **settings)

    checkpoint = load_checkpoint(latest_checkpoint(tmp_path))
    resumed = MetaLearner.from_state(checkpoint.state["learner"])
    history = run_meta_training(
        resumed,
        batches[checkpoint.step :],
        start=checkpoint.step,
        history=checkpoint.state["history"],
        **settings,
    )
    assert resumed.weights_seq_no == straight.weights_seq_no == 10
    _assert_same(resumed.get_state()["params"], straight.get_state()["params"])
    assert history == straight_history
    assert history["iteration"] == [2, 4, 6, 8, 10]  # history_every, whatever log_every is
    assert len(history["query_loss"]) == 5


def test_the_loop_refuses_too_few_meta_batches() -> None:
    with pytest.raises(ValueError) as caught:
        run_meta_training(
            MetaLearner(CONFIG), _meta_batches(2), start=1, stop=5, log_every=1, checkpoint_every=1
        )
    assert str(caught.value) == (
        "meta_batches ran out after 2 meta-batches; expected 4 (iterations 2..5)"
    )
