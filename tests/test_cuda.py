"""The learner, batching and store paths on a CUDA device, checked against the same work on the
CPU. CI has no GPU, so these are skipped there; `bench/gpu_checks.sh` runs them (with the
learner benchmark) on a GPU machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from learners import MetaLearner
from pipeline.artifacts import ArtifactStore
from pipeline.consumer import learner_state_files, load_learner, predict
from pipeline.streams.collate import finalize
from tests.helpers.tolerances import largest, rounding_tolerance, trajectory_tolerance

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(300),
]

CUDA = torch.device("cuda")
_STEPS = 3
# Rounded operations behind one meta-gradient entry of a 2-8-1 tanh net, one inner step on
# 5 rows and a query loss on 6, and the second-order backward through both (as in
# test_learners_compiled.py): about 4 * 100 < 500. cuBLAS and the CPU's BLAS sum in different
# orders, so each side may round differently at every one of them.
_OPS = 500


def _config(dtype: str = "float64", **overrides: Any) -> dict[str, Any]:
    module = {"obs_dim": 2, "action_dim": 1, "model": {"hidden_sizes": [8], "activation": "tanh"}}
    return {
        "modules": {"m": module},
        "algorithm": "metasgd",
        "inner": {"lr": 0.1, "learned_lr": "tensor"},
        "outer": {"lr": 0.01, "clip_norm": 5.0},
        "dtype": dtype,
        **overrides,
    }


def _meta_batch(
    seed: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float64
) -> dict:
    g = torch.Generator().manual_seed(seed)

    def part(rows: int) -> dict:
        obs = torch.rand(4, rows, 2, generator=g, dtype=dtype) * 4 - 2
        actions = torch.sin(obs.sum(-1, keepdim=True))
        return {"m": {"obs": obs.to(device), "actions": actions.to(device)}}

    return {"support": part(5), "query": part(6)}


def _assert_close_params(found: MetaLearner, expected: MetaLearner, dtype: torch.dtype) -> None:
    leaves = [*expected.meta_params["m"].values(), *expected.log_lrs.values()]
    atol = trajectory_tolerance(
        dtype,
        steps=_STEPS,
        step_size=expected.config.outer.lr,
        params_magnitude=largest(leaves),
        ops=_OPS,
    )
    for name, p in expected.meta_params["m"].items():
        assert found.meta_params["m"][name].device.type == found.device.type
        torch.testing.assert_close(found.meta_params["m"][name].cpu(), p.cpu(), rtol=0, atol=atol)
    for key, log_lr in expected.log_lrs.items():
        torch.testing.assert_close(found.log_lrs[key].cpu(), log_lr.cpu(), rtol=0, atol=atol)


def test_meta_steps_on_the_gpu_equal_the_cpus() -> None:
    cpu, gpu = MetaLearner(_config()), MetaLearner(_config(), device=CUDA)
    for seed in range(_STEPS):
        cpu_metrics = cpu.step(_meta_batch(seed))
        gpu_metrics = gpu.step(_meta_batch(seed, CUDA))
        atol = rounding_tolerance(
            torch.float64, magnitude=float(cpu_metrics["query_loss"]) + 1, ops=_OPS
        )
        torch.testing.assert_close(
            gpu_metrics["query_loss"].cpu(), cpu_metrics["query_loss"], rtol=0, atol=atol
        )
    gpu.check_finite()
    assert gpu.weights_seq_no == cpu.weights_seq_no == _STEPS
    _assert_close_params(gpu, cpu, torch.float64)


def test_vmap_equals_the_per_task_loop_on_the_gpu() -> None:
    vmapped = MetaLearner(_config(), device=CUDA)
    looped = MetaLearner(_config(vectorize="loop"), device=CUDA)
    for seed in range(_STEPS):
        vmapped.step(_meta_batch(seed, CUDA))
        looped.step(_meta_batch(seed, CUDA))
    _assert_close_params(vmapped, looped, torch.float64)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_the_compiled_step_equals_eager_on_the_gpu_with_one_compilation(mode: str) -> None:
    compiled = MetaLearner(_config("float32", compile=mode), device=CUDA)
    eager = MetaLearner(_config("float32"), device=CUDA)
    compiled.step(_meta_batch(0, CUDA, torch.float32))
    eager.step(_meta_batch(0, CUDA, torch.float32))
    with torch.compiler.set_stance("fail_on_recompile"):
        for seed in range(1, _STEPS):
            compiled.step(_meta_batch(seed, CUDA, torch.float32))
            eager.step(_meta_batch(seed, CUDA, torch.float32))
    compiled.check_finite()
    assert compiled.compiled_step.fallback is None
    assert compiled.compiled_step.compilations == 1
    assert compiled.weights_seq_no == _STEPS
    _assert_close_params(compiled, eager, torch.float32)
    torch._dynamo.reset()


def test_a_gpu_learners_state_resumes_on_the_cpu_and_back() -> None:
    gpu = MetaLearner(_config(), device=CUDA)
    for seed in range(2):
        gpu.step(_meta_batch(seed, CUDA))
    cpu = MetaLearner.from_state(gpu.get_state(), device="cpu")
    for name, p in gpu.meta_params["m"].items():
        assert torch.equal(cpu.meta_params["m"][name], p.cpu())
    back = MetaLearner.from_state(cpu.get_state(), device=CUDA)
    for learner, device in ((gpu, CUDA), (cpu, "cpu"), (back, CUDA)):
        learner.step(_meta_batch(2, device))
    for name, p in gpu.meta_params["m"].items():
        assert torch.equal(back.meta_params["m"][name], p)
    _assert_close_params(cpu, gpu, torch.float64)


def test_parameters_published_from_the_gpu_load_onto_it(tmp_path: Path) -> None:
    gpu = MetaLearner(_config(), device=CUDA)
    gpu.step(_meta_batch(0, CUDA))
    state = gpu.get_state()
    store = ArtifactStore(tmp_path / "store", durable=False)
    ref = store.publish(
        "gpu", state["params"], metrics={}, config=gpu.config, lineage={},
        files=learner_state_files(state),
    )  # fmt: skip
    params = store.load_params(ref, device="cuda")
    for name, p in gpu.meta_params["m"].items():
        assert params["m"][name].device.type == "cuda"
        assert torch.equal(params["m"][name], p)

    loaded = load_learner("gpu@latest", root=tmp_path / "store", device="cuda")
    obs = torch.rand(7, 2, dtype=torch.float64, device=CUDA)
    support = _meta_batch(1, CUDA)["support"]["m"]
    task = {"m": {key: value[0] for key, value in support.items()}}
    assert torch.equal(
        predict(loaded, obs, module_id="m", params=loaded.adapt(None, task)),
        predict(gpu, obs, module_id="m", params=gpu.adapt(None, task)),
    )


def test_finalize_moves_a_meta_batch_to_the_gpu_unchanged() -> None:
    batch = _meta_batch(0)
    moved = finalize(batch, "cuda")
    torch.cuda.current_stream().synchronize()
    for part in ("support", "query"):
        for key, tensor in batch[part]["m"].items():
            assert moved[part]["m"][key].device.type == "cuda"
            assert torch.equal(moved[part]["m"][key].cpu(), tensor)


class _Recording(torch.nn.Module):
    """A 2-8-1 tanh net that records the float32 matmul precision of every forward pass."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)
        )
        self.seen: list[str] = []

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.seen.append(torch.get_float32_matmul_precision())
        return self.net(obs)


def test_tf32_applies_inside_the_learners_calls_only() -> None:
    tf32_model, ieee_model = _Recording(), _Recording()
    tf32 = MetaLearner(
        _config("float32", float32_matmul="tf32"), models={"m": tf32_model}, device=CUDA
    )
    ieee = MetaLearner(_config("float32"), models={"m": ieee_model}, device=CUDA)
    before = torch.get_float32_matmul_precision()
    tf32_grads, _ = tf32.compute_meta_gradients(_meta_batch(0, CUDA, torch.float32))
    ieee_grads, _ = ieee.compute_meta_gradients(_meta_batch(0, CUDA, torch.float32))
    assert set(tf32_model.seen) == {"high"} and set(ieee_model.seen) == {before}
    assert torch.get_float32_matmul_precision() == before
    # TF32 keeps 10 mantissa bits (eps 2**-10) in each product's inputs.
    for name, grad in ieee_grads.params["m"].items():
        atol = _OPS * 2**-10 * (largest([grad]) + 1)
        torch.testing.assert_close(tf32_grads.params["m"][name], grad, rtol=0, atol=atol)
