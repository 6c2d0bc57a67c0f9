"""Scale-out on Ray Train: averaged meta-gradients equal one learner's over all tasks, CPU
shares that leave room for Ray Data reads, and a run that loses a worker mid-way and still
ends with the parameters of an uninterrupted single-learner run.
"""

from __future__ import annotations

import pytest
import torch

from flows.config import ConfigError, validate_config
from flows.runs.retry_policy import ClusterSetupError, is_permanent
from flows.scale_out import ParametersDivergedError, driver, scaling_config, worker_cpus
from flows.scale_out.cluster_storage import check_reachable
from flows.stages.train import train
from learners import MetaLearner
from learners.training import data_parallel
from learners.training.data_parallel import pack_gradients, params_checksum, unpack_gradients
from tests.helpers.tolerances import largest, rounding_tolerance, trajectory_tolerance

_LEARNER = {
    "modules": {"m": {"obs_dim": 1, "action_dim": 1, "model": {"hidden_sizes": [8, 8]}}},
    "inner": {"lr": 0.1},
    "outer": {"lr": 0.01},
}


def _meta_batch(tasks: int, seed: int, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part(rows: int) -> dict:
        x = torch.rand(tasks, rows, 1, generator=g, dtype=dtype) * 10 - 5
        scale = 1 + torch.rand(tasks, 1, 1, generator=g, dtype=dtype)
        return {"m": {"obs": x, "actions": torch.sin(x) * scale}}

    return {"support": part(5), "query": part(5)}


def _split(meta_batch: dict, cut: int) -> tuple[dict, dict]:
    def take(index: slice) -> dict:
        return {
            part: {m: {c: t[index] for c, t in cols.items()} for m, cols in batch.items()}
            for part, batch in meta_batch.items()
        }

    return take(slice(None, cut)), take(slice(cut, None))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("cut", [4, 3], ids=["equal-halves", "3-and-5-tasks"])
def test_averaged_gradients_of_two_workers_equal_one_learner_on_all_tasks(cut):
    # In float64, so that the comparison is tight: the workers differ from the whole by the
    # rounding of their sums alone.
    config = {**_LEARNER, "dtype": "float64"}
    whole = MetaLearner(config)
    workers = [MetaLearner(config), MetaLearner(config)]
    for step in range(3):
        meta_batch = _meta_batch(8, seed=step, dtype=torch.float64)
        whole.step(meta_batch)
        shares = _split(meta_batch, cut)
        computed = [w.compute_meta_gradients(s) for w, s in zip(workers, shares, strict=True)]
        # What the all-reduce does: sum every worker's buffer.
        summed = sum(pack_gradients(grads, m["num_tasks"]) for grads, m in computed)
        for worker, (grads, _) in zip(workers, computed, strict=True):
            worker.apply_meta_gradients(unpack_gradients(summed.clone(), grads))
    # A meta-gradient of the 1-8-8-1 net (one inner step, 5 rows) is under 1,000 rounded
    # operations deep (test_learners_meta counts them).
    atol = trajectory_tolerance(
        torch.float64,
        steps=3,
        step_size=whole.config.outer.lr,
        params_magnitude=largest(whole.meta_params["m"].values()),
        ops=1_000,
    )
    for worker in workers:
        assert worker.weights_seq_no == whole.weights_seq_no == 3
        for name, expected in whole.meta_params["m"].items():
            torch.testing.assert_close(worker.meta_params["m"][name], expected, rtol=0, atol=atol)
    assert params_checksum(workers[0]) == params_checksum(workers[1])


@pytest.mark.timeout(30)
def test_the_checksum_sees_one_changed_parameter_and_swapped_entries():
    learner, other = MetaLearner(_LEARNER), MetaLearner(_LEARNER)
    assert params_checksum(learner) == params_checksum(other)
    with torch.no_grad():
        bias = other.meta_params["m"]["layers.0.bias"]
        bias[[0, 1]] = bias[[1, 0]]
    assert params_checksum(learner) != params_checksum(other)


class _TwoWorkers:
    """``torch.distributed`` as seen by rank 0 of two workers whose other worker holds
    ``other``'s parameters (only what ``check_in_sync`` calls)."""

    ReduceOp = torch.distributed.ReduceOp

    def __init__(self, other: MetaLearner) -> None:
        self.other = params_checksum(other)

    def all_reduce(self, extremes: torch.Tensor, op: object) -> None:
        assert op == self.ReduceOp.MAX
        extremes.copy_(torch.maximum(extremes, torch.stack([self.other, -self.other])))

    def get_world_size(self) -> int:
        return 2

    def get_rank(self) -> int:
        return 0


@pytest.mark.timeout(30)
def test_workers_whose_parameters_differ_stop_with_a_clear_error(monkeypatch):
    learner, other = MetaLearner(_LEARNER), MetaLearner(_LEARNER)
    monkeypatch.setattr(data_parallel, "dist", _TwoWorkers(other))
    data_parallel.check_in_sync(learner, iteration=7)  # identical: nothing happens
    with torch.no_grad():
        other.meta_params["m"]["layers.2.bias"].add_(1e-6)
    monkeypatch.setattr(data_parallel, "dist", _TwoWorkers(other))
    mine, theirs = float(params_checksum(learner)), float(params_checksum(other))
    with pytest.raises(ParametersDivergedError) as error:
        data_parallel.check_in_sync(learner, iteration=7)
    assert str(error.value) == (
        f"meta-parameters differ between the 2 workers at iteration 7 (weights_seq_no 0): "
        f"checksums range from {min(mine, theirs)!r} to {max(mine, theirs)!r}, this worker "
        f"(rank 0) has {mine!r}; expected one value. The workers must start from the same "
        "learner state and apply the same averaged meta-gradients"
    )


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("learners", "cpus", "reserved", "share"),
    [(2, 2, 0.5, 0.75), (1, 2, 0.5, 1.0), (3, 2, 0.5, 0.5), (4, 64, 0.5, 1.0), (3, 2, 0, 0.6666)],
)
def test_workers_share_what_the_read_reservation_leaves(learners, cpus, reserved, share):
    # A quotient floored to a multiple of 1e-4: a few float64 roundings of a share below 1.
    atol = rounding_tolerance(torch.float64, magnitude=1.0, ops=4)
    assert worker_cpus(learners, cpus, reserved) == pytest.approx(share, rel=0, abs=atol)
    assert learners * worker_cpus(learners, cpus, reserved) <= cpus - reserved


@pytest.mark.timeout(30)
def test_a_reservation_that_leaves_no_cpu_is_refused():
    with pytest.raises(ValueError) as error:
        worker_cpus(2, 2, 2.5)
    assert str(error.value) == (
        "ray.reserved_read_cpus=2.5 leaves 0 of the cluster's 2 CPUs for 2 learners; expected "
        "at least 0.0002. Lower ray.reserved_read_cpus or join a larger cluster (ray.address)"
    )


def _config(tmp_path, **training) -> object:
    return validate_config(
        {
            "data": {"train": str(tmp_path / "train"), "heldout": str(tmp_path / "heldout")},
            "learners": {"num_learners": 2},
            "training": training,
            "artifacts": {"name": "scale", "root": str(tmp_path / "artifacts")},
        }
    )


@pytest.mark.timeout(30)
def test_a_run_the_cluster_cannot_place_is_refused(tmp_path):
    on_gpus = _config(tmp_path, device="cuda")
    with pytest.raises(ValueError) as error:
        scaling_config(on_gpus, {"CPU": 8.0})
    assert str(error.value) == (
        "training.device='cuda' with learners.num_learners=2 needs 2 GPUs (one per worker); "
        "the Ray cluster has 0. Lower num_learners or set training.device to 'cpu'"
    )
    with pytest.raises(ValueError, match=r"training\.device=.mps. is not available on Ray Train"):
        scaling_config(_config(tmp_path, device="mps"), {"CPU": 8.0})
    placed = scaling_config(_config(tmp_path), {"CPU": 2.0})
    assert (placed.num_workers, placed.use_gpu, placed.num_cpus_per_worker) == (2, False, 0.75)
    assert placed.placement_strategy == "PACK"


@pytest.mark.timeout(30)
@pytest.mark.parametrize("strategy", ["SPREAD", "STRICT_SPREAD"])
def test_the_placement_strategy_reaches_the_scaling_config(tmp_path, strategy):
    cfg = _config(tmp_path)
    cfg = validate_config({**cfg.model_dump(mode="json"), "ray": {"placement_strategy": strategy}})
    assert scaling_config(cfg, {"CPU": 4.0}).placement_strategy == strategy
    with pytest.raises(ConfigError) as caught:
        validate_config({**cfg.model_dump(mode="json"), "ray": {"placement_strategy": "FILL"}})
    assert str(caught.value) == (
        "invalid config config (1 error):\n  ray.placement_strategy: Input should be 'PACK', "
        "'SPREAD' or 'STRICT_SPREAD' (got 'FILL')"
    )


@pytest.mark.timeout(30)
def test_local_paths_are_refused_on_a_cluster_of_several_nodes(tmp_path):
    cfg = _config(tmp_path, checkpoint_dir="runs")
    check_reachable(cfg, nodes=1)
    with pytest.raises(ValueError) as caught:
        check_reachable(cfg, nodes=3)
    assert str(caught.value) == (
        f"the Ray cluster has 3 nodes, but training.checkpoint_dir='runs', data.train="
        f"'{tmp_path / 'train'}', data.heldout='{tmp_path / 'heldout'}' are local paths that "
        "the other nodes may not see; set training.checkpoint_dir=s3://BUCKET/PREFIX (and "
        "s3:// datasets), or training.shared_filesystem=true if every node mounts these paths"
    )
    on_s3 = validate_config(
        {
            **cfg.model_dump(mode="json"),
            "data": {"train": "s3://data/train", "heldout": str(tmp_path / "heldout")},
            "training": {"checkpoint_dir": "s3://bucket/runs"},
        }
    )
    with pytest.raises(ValueError) as caught:
        check_reachable(on_s3, nodes=2)
    assert str(caught.value) == (
        f"the Ray cluster has 2 nodes, but data.heldout='{tmp_path / 'heldout'}' is a local "
        "path that the other nodes may not see; set training.checkpoint_dir=s3://BUCKET/PREFIX "
        "(and s3:// datasets), or training.shared_filesystem=true if every node mounts these "
        "paths"
    )
    shared = _config(tmp_path, checkpoint_dir="/mnt/nfs/runs", shared_filesystem=True)
    check_reachable(shared, nodes=3)


class _FailingTrainer:
    """A ``TorchTrainer`` whose workers all failed with ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def fit(self) -> None:
        from ray.train.v2.api.exceptions import WorkerGroupError

        raise WorkerGroupError("both workers failed", {0: self.error, 1: self.error})


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "error", [ValueError("bad data"), NotImplementedError("no such rule"), ZeroDivisionError()]
)
def test_a_worker_error_that_a_retry_cannot_fix_fails_the_task_at_once(error):
    with pytest.raises(type(error)) as caught:
        driver._fit(_FailingTrainer(error), "runs/r")
    assert caught.value is error  # the worker's own error: the flow does not retry it
    assert is_permanent(error)


@pytest.mark.timeout(60)
def test_workers_that_cannot_reach_the_storage_or_offmeta_fail_in_one_permanent_line():
    unreachable = RuntimeError(
        "Unable to set up cluster storage with the following settings:\nStorageContext<...>"
        "\nCheck that all nodes in the cluster have read/write access"
    )
    with pytest.raises(ClusterSetupError) as caught:
        driver._fit(_FailingTrainer(unreachable), "runs/r")
    assert str(caught.value) == (
        "a Ray Train worker could not write the run's checkpoints to runs/r (RuntimeError: "
        "Unable to set up cluster storage with the following settings: StorageContext<...> "
        "Check that all nodes in the cluster have read/write access); every node must reach "
        "it: set training.checkpoint_dir=s3://BUCKET/PREFIX or a path on a filesystem every "
        "node mounts (training.shared_filesystem=true)"
    )
    assert is_permanent(caught.value)
    missing = ModuleNotFoundError("No module named 'flows'", name="flows")
    with pytest.raises(ClusterSetupError) as caught:
        driver._fit(_FailingTrainer(missing), "s3://b/runs/r")
    assert str(caught.value) == (
        "a Ray Train worker cannot import offmeta (No module named 'flows'); install offmeta "
        "on every node, or ship it with ray.runtime_env (e.g. {working_dir: ., excludes: "
        "[runs, artifacts]}: docs/run-storage.md)"
    )


@pytest.mark.timeout(60)
def test_a_lost_worker_is_left_to_the_flow_to_retry():
    from ray.train import TrainingFailedError

    with pytest.raises(TrainingFailedError):
        driver._fit(_FailingTrainer(RuntimeError("worker died")), "runs/r")
    assert not is_permanent(RuntimeError("worker died"))


@pytest.mark.timeout(30)
def test_the_in_process_stage_leaves_ray_train_to_the_flow(tmp_path):
    with pytest.raises(ValueError) as error:
        train(_config(tmp_path), None, run_dir=tmp_path / "run")
    assert str(error.value) == (
        "flows.stages.train.train trains in this process (learners.num_learners 0), got "
        "learners.num_learners=2; use flows.scale_out.train_on_ray for Ray Train workers"
    )
    assert not (tmp_path / "run").exists()
