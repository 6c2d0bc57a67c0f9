"""Learner benchmarks, each printed as a ratio against a baseline measured in the same run.

1. `DifferentiableLearner.update` against a hand-written `torch.func` loop (same MLP, batch,
   steps and learning rate): target <= 1.10x the time.
2. A vmapped `MetaLearner.step` over 25 sinusoid tasks against the per-task loop: >= 6x.
3. Memory saved for backward by the meta-loss graph for 1..16 inner steps: linear in the
   steps for second order, flat for first order (slopes printed).
4. `--full`: the MAML paper's sinusoid run (70k meta-iterations) on the shipped sample, a
   held-out steps 0/1/10 table; target: MSE after 1 step <= 0.40. Minutes; on demand only.
5. `MetaLearner.step`, eager and compiled (`MetaConfig.compile`), for four shapes: 25 tasks x
   K=10 on 1-40-40-1 (the sinusoid), 1 task x K=5, 64 tasks x K=256 on 20-256-256-6, and
   Meta-World reach-v3's 10 tasks x K=Q=20 on 39-256-256-4 (`bench/baselines/meta_step.py`).
   The headline: the eager step against the fastest hand-written eager form, the vmapped inner
   `grad` step with `.backward()` and `torch.optim.Adam` (target <= 1.05x on CPU, sinusoid and
   one task), as `run_meta_training` runs it on a step whose `support_loss_after` no metrics
   read will see (that metric's own forward pass left out; the step with it is recorded
   beside); besides, the eager and compiled steps against the pure `torch.func` step eager and
   compiled (sinusoid: <= 1.10x). Compiling takes 15-70 s per function on the 2-core machine:
   `--quick` measures the sinusoid and one-task shapes, `--shapes` the ones named. `--device
   cuda` runs 5 on a GPU (compile mode reduce-overhead; target: compiled step <= 1.5 ms for the
   sinusoid and the large shape); `--float32-matmul tf32` runs learners and baselines on TF32.
   `bench/gpu_checks.sh` runs it there with the CUDA tests.
6. The context learner's `MetaLearner.step` (`algorithm: context`, reach-v3's sizes: 10 tasks
   x K=Q=20, encoder 83-256-256-16 over `[obs, action, reward, next obs]`, policy
   55-256-256-4 over `[obs, latent]`) against a hand-written encoder + conditioned-policy
   step (`bench/baselines/context_step.py`), eager and compiled; the two are checked to give
   the same parameters after one step first. CPU only.

Run: `.venv/bin/python bench/learners.py [--quick] [--shapes S,..] [--figures 5,6] [--full]
[--device cuda] [--float32-matmul tf32]`. Timings are the
best of many calls, interleaved with the baseline's, after warm-up (on a GPU each call waits
for the device). Each figure is written as a record (`bench/records.py`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.func import functional_call, grad

# Run as a script, this file's own folder comes first on sys.path and its name would shadow
# the `learners` package; the repository root must come first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.baselines.context_step import (
    ENCODER,
    LATENT,
    POLICY,
    REACH,
    ContextShape,
    context_batch,
    context_models,
    context_state,
    context_step,
)
from bench.baselines.meta_step import (
    SHAPES,
    Shape,
    State,
    autograd_step,
    initial_state,
    meta_batch,
    model_of,
    torch_func_step,
)
from bench.records import Baseline, write_record
from learners import (
    MLP,
    DifferentiableLearner,
    InnerConfig,
    MetaConfig,
    MetaLearner,
    build_models,
    mse_loss,
    params_from_modules,
)
from learners.inner.rule import InnerRule, build_inner_rule
from learners.meta.graph_memory import saved_tensor_bytes
from learners.meta.precision import float32_matmul
from learners.params import buffers_from_modules, map_params

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "samples" / "sinusoid"


def _best_times(
    fns: dict[str, Callable[[], object]],
    calls: int,
    *,
    warmup: int = 5,
    sync: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Best (minimum) seconds per call over `calls` calls of each function, interleaved call
    by call after warm-up: on a shared machine the minimum is the least disturbed call, and
    interleaving exposes baseline and candidate to the same conditions. `sync` waits for the
    device after each call (a GPU runs asynchronously)."""
    wait = sync or (lambda: None)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
        wait()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(calls):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            wait()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def _sinusoid_batch(tasks: int, rows: int, rng: np.random.Generator) -> dict:
    amplitude = rng.uniform(0.1, 5.0, (tasks, 1, 1))
    phase = rng.uniform(0.0, np.pi, (tasks, 1, 1))
    x = rng.uniform(-5.0, 5.0, (tasks, 2 * rows, 1))
    y = amplitude * np.sin(x - phase)

    def part(cut: slice) -> dict:
        obs = torch.tensor(x[:, cut], dtype=torch.float32)
        return {
            "default_policy": {"obs": obs, "actions": torch.tensor(y[:, cut], dtype=torch.float32)}
        }

    return {"support": part(slice(0, rows)), "query": part(slice(rows, 2 * rows))}


def _update_case(obs_dim: int, hidden: tuple[int, ...], rows: int) -> None:
    torch.manual_seed(0)
    model = MLP(obs_dim, 1, hidden)
    params = params_from_modules(model, clone=True)
    obs, actions = torch.randn(rows, obs_dim), torch.randn(rows, 1)
    batch = {"default_policy": {"obs": obs, "actions": actions}}
    learner = DifferentiableLearner(
        {"default_policy": model}, InnerConfig(lr=0.01, steps=5), {"default_policy": mse_loss}
    )

    def loss(p: dict, o: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        return (functional_call(model, p, (o,)) - a).square().mean()

    loss_grad = grad(loss)

    def hand_written() -> dict:
        p = params["default_policy"]
        for _ in range(5):
            g = loss_grad(p, obs, actions)
            p = {name: p[name] - 0.01 * g[name] for name in p}
        return p

    calls = 300
    times = _best_times(
        {"hand": hand_written, "update": lambda: learner.update(params, batch)}, calls
    )
    print(
        f"   MLP {obs_dim}-{'-'.join(map(str, hidden))}-1, batch {rows}: "
        f"hand {times['hand'] * 1e3:.2f} ms, update {times['update'] * 1e3:.2f} ms, "
        f"ratio {times['update'] / times['hand']:.3f} (target <= 1.10)"
    )
    mlp = "-".join(map(str, (obs_dim, *hidden, 1)))
    write_record(
        "learners",
        f"1-update-mlp-{mlp}",
        "DifferentiableLearner.update, 5 SGD steps, seconds per call (best of the calls)",
        times["update"],
        "s",
        baseline=Baseline("hand-written torch.func loop, same steps, s per call", times["hand"]),
        target="<= 1.10",
        shape={"mlp": mlp, "batch": rows, "steps": 5, "calls": calls},
    )


def bench_update_overhead() -> None:
    print("1. DifferentiableLearner.update vs a hand-written torch.func loop (5 SGD steps)")
    _update_case(1, (40, 40), 10)
    _update_case(16, (64, 64), 256)


def bench_vmap_vs_loop() -> None:
    print("2. MetaLearner.step over 25 sinusoid tasks: vmap vs per-task loop")
    meta_batch = _sinusoid_batch(25, 10, np.random.default_rng(0))
    learners = {v: MetaLearner({"vectorize": v}) for v in ("vmap", "loop")}
    calls = 60
    times = _best_times({v: lambda v=v: learners[v].step(meta_batch) for v in learners}, calls)
    print(
        f"   vmap {times['vmap'] * 1e3:.2f} ms, loop {times['loop'] * 1e3:.2f} ms, "
        f"speed-up {times['loop'] / times['vmap']:.1f}x (target >= 6x)"
    )
    write_record(
        "learners",
        "2-vmap-vs-loop",
        "vmapped MetaLearner.step, meta-steps/s (best call)",
        1 / times["vmap"],
        "steps/s",
        baseline=Baseline("per-task loop MetaLearner.step, meta-steps/s", 1 / times["loop"]),
        target=">= 6",
        shape={"tasks": 25, "support": 10, "query": 10, "calls": calls},
    )


def bench_saved_memory() -> None:
    print("3. Saved-for-backward memory of the meta-loss (25 tasks) against inner steps")
    meta_batch = _sinusoid_batch(25, 10, np.random.default_rng(1))
    support, query = meta_batch["support"], meta_batch["query"]
    steps_range = [1, 2, 4, 8, 16]
    slopes, saved = {}, {}
    for algorithm in ("maml", "fomaml"):
        # The learner's own inner rule, over parameters that require grad (meta-parameters).
        config = MetaConfig.model_validate({"algorithm": algorithm})
        models = build_models(config.modules, config.seed)
        rule = build_inner_rule(config, models, buffers_from_modules(models))
        params = map_params(lambda p: p.detach().requires_grad_(), params_from_modules(models))

        def meta_loss(steps: int, rule: InnerRule = rule, params: dict = params) -> torch.Tensor:
            def task(task_support: dict, task_query: dict) -> torch.Tensor:
                adapted, _ = rule.adapt(params, task_support, lrs=None, steps=steps)
                return rule.outer_losses(adapted, task_query)["default_policy"]

            return torch.func.vmap(task)(support, query).mean()

        sizes = [saved_tensor_bytes([meta_loss(steps)]) / 1024 for steps in steps_range]
        saved[algorithm] = sizes
        slopes[algorithm] = float(np.polyfit(steps_range, sizes, 1)[0])
        row = ", ".join(f"{n}: {kib:.0f}" for n, kib in zip(steps_range, sizes, strict=True))
        print(f"   {algorithm:7s} KiB by steps {{{row}}}; slope {slopes[algorithm]:.1f} KiB/step")
    print(
        f"   second order grows {slopes['maml']:.1f} KiB per step, first order "
        f"{slopes['fomaml']:.1f} (flat: {abs(slopes['fomaml']) < 0.01 * slopes['maml']})"
    )
    write_record(
        "learners",
        "3-saved-memory-first-order",
        "first-order (fomaml) saved-for-backward growth, |slope| over inner steps",
        abs(slopes["fomaml"]),
        "KiB/step",
        baseline=Baseline("second-order (maml) growth, slope", slopes["maml"]),
        target="<= 0.01",
        shape={"tasks": 25, "support": 10, "query": 10, "inner_steps": steps_range},
        details={"kib_by_steps": saved},
    )


def _sample_tasks(split: str) -> tuple[np.ndarray, np.ndarray]:
    import pyarrow.parquet as pq

    table = pq.ParquetDataset(sorted((SAMPLE / split).glob("*.parquet"))).read()
    obs = table.column("obs").combine_chunks().to_numpy_ndarray().astype(np.float32)
    actions = table.column("actions").combine_chunks().to_numpy_ndarray().astype(np.float32)
    _, task = np.unique(np.asarray(table.column("task_id").to_pylist()), return_inverse=True)
    order = np.argsort(task, kind="stable")
    shape = (int(task.max()) + 1, -1, 1)
    return obs[order].reshape(shape), actions[order].reshape(shape)


def bench_sinusoid_full(iterations: int = 70_000) -> None:
    print(f"4. Sinusoid reproduction: MAML, {iterations} meta-iterations, held-out table")
    x_train, y_train = _sample_tasks("train")
    x_held, y_held = _sample_tasks("heldout")
    k = x_train.shape[1] // 2

    def meta_batch(x: np.ndarray, y: np.ndarray) -> dict:
        def part(cut: slice) -> dict:
            obs, actions = torch.from_numpy(x[:, cut]), torch.from_numpy(y[:, cut])
            return {"default_policy": {"obs": obs, "actions": actions}}

        return {"support": part(slice(0, k)), "query": part(slice(k, None))}

    learner = MetaLearner({"algorithm": "maml"})
    held_out = meta_batch(x_held, y_held)
    rng = np.random.default_rng(0)
    table = {0: learner.evaluate(held_out, steps=(0, 1, 10))}
    start = time.perf_counter()
    for iteration in range(1, iterations + 1):
        tasks = rng.choice(len(x_train), size=25, replace=False)
        order = rng.permuted(np.tile(np.arange(2 * k), (25, 1)), axis=1)[..., None]
        xs = np.take_along_axis(x_train[tasks], order, axis=1)
        ys = np.take_along_axis(y_train[tasks], order, axis=1)
        learner.step(meta_batch(xs, ys))
        if iteration % 10_000 == 0 or iteration == 5_000:
            table[iteration] = learner.evaluate(held_out, steps=(0, 1, 10))
            print(
                f"   {iteration:6d} its ({time.perf_counter() - start:.0f} s): {table[iteration]}"
            )
    print("   | meta-iterations | steps 0 | steps 1 | steps 10 |")
    print("   |---:|---:|---:|---:|")
    for iteration, curve in table.items():
        print(f"   | {iteration} | {curve[0]:.3f} | {curve[1]:.3f} | {curve[10]:.3f} |")
    print(f"   held-out MSE after 1 step {table[iterations][1]:.3f} (target <= 0.40)")
    write_record(
        "learners",
        "4-sinusoid-mse-1-step",
        "MAML on the shipped sinusoid sample, held-out MSE after 1 inner step",
        float(table[iterations][1]),
        "MSE",
        target="<= 0.40",
        shape={"iterations": iterations, "tasks_per_step": 25, "support": k, "query": k},
        details={"held_out_by_iteration": {str(i): curve for i, curve in table.items()}},
    )


# Calls timed and warm-up calls per shape: a large-shape step takes most of a second on CPU.
_CALLS = {"sinusoid": (100, 5), "one-task": (200, 5), "large": (5, 1), "reach-v3": (60, 5)}
_GPU_CALLS = (300, 20)  # every shape's step takes milliseconds on a GPU
_COMPILED_TARGET_S = 1.5e-3  # on a GPU, sinusoid and large shapes


def _hand_runner(step: Callable, state: list, batch: dict, cuda_graphs: bool) -> Callable[[], None]:
    """One call of a hand-written pure step, keeping its state in `state[0]`."""

    def run() -> None:
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        new = step(state[0], batch)
        # CUDA graphs reuse their output buffers on the next replay: keep copies.
        state[0] = tuple(_cloned(part) for part in new) if cuda_graphs else new

    return run


def _cloned(part: dict | torch.Tensor) -> dict | torch.Tensor:
    if isinstance(part, dict):
        return {k: v.clone() for k, v in part.items()}
    return part.clone()


def _meta_step_case(shape: Shape, device: torch.device, mode: str, matmul: str) -> None:
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    wait = sync or (lambda: None)
    batch = meta_batch(shape, device)
    config = {**shape.config(), "float32_matmul": matmul}
    eager = MetaLearner(config, device=device)
    compiled = MetaLearner({**config, "compile": mode}, device=device)
    model = model_of(shape, device)
    hand = torch_func_step(model)
    hand_compiled = torch.compile(hand, mode=mode, fullgraph=True, dynamic=False)
    cuda_graphs = device.type == "cuda" and mode == "reduce-overhead"
    runners = {
        "hand": _hand_runner(hand, [initial_state(model)], batch, False),
        "hand compiled": _hand_runner(hand_compiled, [initial_state(model)], batch, cuda_graphs),
    }
    compiled.step(batch)
    wait()
    learner_compile = compiled.compiled_step.compile_seconds
    started = time.perf_counter()
    runners["hand compiled"]()
    wait()
    hand_compile = time.perf_counter() - started
    if compiled.compiled_step.fallback is not None:
        print(f"   {shape.name}: the compiled learner fell back to eager: ", end="")
        print(compiled.compiled_step.fallback)
    autograd = autograd_step(model)
    calls, warmup = _CALLS[shape.name] if device.type == "cpu" else _GPU_CALLS
    times = _best_times(
        {
            "eager": lambda: eager.step(batch),
            "eager unread": lambda: eager.step(batch, support_loss_after=False),
            "compiled": lambda: compiled.step(batch),
            "hand": runners["hand"],
            "hand compiled": runners["hand compiled"],
            "autograd": lambda: autograd(batch),
        },
        calls,
        warmup=warmup,
        sync=sync,
    )
    recompiled = compiled.compiled_step.compilations - 1
    ms = {name: seconds * 1e3 for name, seconds in times.items()}
    eager_ratio, compiled_ratio = (
        times["eager"] / times["hand"],
        times["compiled"] / times["hand compiled"],
    )
    autograd_ratio = times["eager unread"] / times["autograd"]
    print(
        f"   {shape.name} ({shape.tasks} tasks x K={shape.support}, Q={shape.query}, MLP "
        f"{shape.record()['mlp']}): eager {ms['eager unread']:.3g} ms vs autograd + "
        f"torch.optim {ms['autograd']:.3g} ms = {autograd_ratio:.2f}x (measuring "
        f"support_loss_after too: {ms['eager']:.3g} ms = "
        f"{times['eager'] / times['autograd']:.2f}x; vs hand torch.func "
        f"{ms['hand']:.3g} ms: {eager_ratio:.2f}x); compiled {ms['compiled']:.3g} ms vs hand "
        f"{ms['hand compiled']:.3g} ms = {compiled_ratio:.2f}x; compile {learner_compile:.0f} s "
        f"vs hand {hand_compile:.0f} s; recompilations {recompiled}"
    )
    target = "<= 1.10" if shape.name == "sinusoid" and device.type == "cpu" else None
    autograd_target = (
        "<= 1.05" if shape.name in ("sinusoid", "one-task") and device.type == "cpu" else None
    )
    measured = {**shape.record(), "calls": calls, "mode": mode}
    if matmul != "ieee":
        measured["float32_matmul"] = matmul
    record = {"shape": measured, "device": str(device)}
    write_record(
        "learners",
        f"5-step-eager-vs-autograd-{shape.name}",
        "MetaLearner.step eager, support_loss_after not read, s per step (best of the calls)",
        times["eager unread"],
        "s",
        baseline=Baseline(
            "vmapped inner grad step, .backward() and torch.optim.Adam (the fastest eager form), s",
            times["autograd"],
        ),
        target=autograd_target,
        details={"torch_func_step_s": times["hand"], "with_support_loss_after_s": times["eager"]},
        # A row of its own: earlier records of this figure measured support_loss_after too.
        shape={**measured, "support_loss_after": "not read"},
        device=str(device),
    )
    write_record(
        "learners",
        f"5-step-eager-{shape.name}",
        "MetaLearner.step eager, s per step (best of the calls)",
        times["eager"],
        "s",
        baseline=Baseline(
            "hand-written torch.func step (grad of vmap, functional Adam), s", times["hand"]
        ),
        target=target,
        details={"autograd_torch_optim_s": times["autograd"]},
        **record,
    )
    write_record(
        "learners",
        f"5-step-compiled-{shape.name}",
        f"MetaLearner.step compiled (compile {mode!r}), s per step (best of the calls)",
        times["compiled"],
        "s",
        baseline=Baseline("hand-written torch.func step compiled whole, s", times["hand compiled"]),
        target=target,
        details={"recompilations": recompiled, "fallback": compiled.compiled_step.fallback},
        **record,
    )
    write_record(
        "learners",
        f"5-compile-seconds-{shape.name}",
        "MetaLearner compiled step: first call (compiling it), s",
        learner_compile,
        "s",
        baseline=Baseline("hand-written torch.func step: first compiled call, s", hand_compile),
        **record,
    )
    if device.type == "cuda" and shape.name in ("sinusoid", "large"):
        write_record(
            "learners",
            f"5-step-compiled-gpu-{shape.name}",
            f"MetaLearner.step compiled (compile {mode!r}) on the GPU, s per step",
            times["compiled"],
            "s",
            target=f"<= {_COMPILED_TARGET_S}",
            **record,
        )


def bench_meta_step(device: torch.device, mode: str, shapes: list[str], matmul: str) -> None:
    print(
        f"5. MetaLearner.step eager and compiled (mode {mode!r}, float32 matmul {matmul}) "
        f"against hand-written torch.func steps, on {device}"
    )
    # The hand-written steps run under the same float32 matmul setting as the learners.
    with float32_matmul(matmul, device):
        for name in shapes:
            shape = next(shape for shape in SHAPES if shape.name == name)
            _meta_step_case(shape, device, mode, matmul)


_CONTEXT_CALLS = (60, 5)


def _hand_context_state(learner: MetaLearner, shape: ContextShape) -> State:
    """The hand-written step's state holding the learner's initial parameters (its own
    names: plain `nn.Sequential` indices, the policy's latent as the prior)."""
    encoder, policy = context_models(shape, torch.device("meta"))
    names = set(context_state(encoder, policy, shape.latent_dim)[0])
    meta = learner.meta_params
    found = {ENCODER + k.removeprefix("layers."): v for k, v in meta["encoder"].items()}
    for name, value in meta["default_policy"].items():
        found[LATENT if name == LATENT else POLICY + name.removeprefix("network.layers.")] = value
    assert set(found) == names, (sorted(found), sorted(names))
    params = {k: v.detach().clone() for k, v in found.items()}
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    return params, zeros, {k: z.clone() for k, z in zeros.items()}, torch.zeros(())


def bench_context_step(shape: ContextShape, mode: str) -> None:
    """6. The context learner's `MetaLearner.step` against the hand-written encoder +
    conditioned-policy step (`bench/baselines/context_step.py`), eager and compiled."""
    print(f"6. context learner's step vs a hand-written encoder + policy step ({shape.name})")
    batch = context_batch(shape, torch.device("cpu"))
    eager = MetaLearner(shape.config())
    compiled = MetaLearner({**shape.config(), "compile": mode})
    encoder, policy = context_models(shape, torch.device("cpu"))
    hand = context_step(encoder, policy)
    hand_compiled = torch.compile(hand, mode=mode, fullgraph=True, dynamic=False)
    # The same computation: one step from the same parameters gives the same parameters.
    check = MetaLearner(shape.config())
    stepped = hand(_hand_context_state(check, shape), batch)[0]
    check.step(batch)
    expected = _hand_context_state(check, shape)[0]
    worst = max((stepped[k] - expected[k]).abs().max().item() for k in expected)
    assert worst < 1e-5, f"the hand-written context step differs from the learner's by {worst}"
    runners = {
        "hand": _hand_runner(hand, [_hand_context_state(eager, shape)], batch, False),
        "hand compiled": _hand_runner(
            hand_compiled, [_hand_context_state(eager, shape)], batch, False
        ),
    }
    compiled.step(batch)
    learner_compile = compiled.compiled_step.compile_seconds
    started = time.perf_counter()
    runners["hand compiled"]()
    hand_compile = time.perf_counter() - started
    if compiled.compiled_step.fallback is not None:
        print(f"   the compiled learner fell back to eager: {compiled.compiled_step.fallback}")
    calls, warmup = _CONTEXT_CALLS
    times = _best_times(
        {
            "eager": lambda: eager.step(batch),
            "eager unread": lambda: eager.step(batch, support_loss_after=False),
            "compiled": lambda: compiled.step(batch),
            **runners,
        },
        calls,
        warmup=warmup,
    )
    ms = {name: seconds * 1e3 for name, seconds in times.items()}
    eager_ratio = times["eager unread"] / times["hand"]
    compiled_ratio = times["compiled"] / times["hand compiled"]
    print(
        f"   {shape.tasks} tasks x K={shape.support}, Q={shape.query}, encoder "
        f"{shape.record()['encoder']}, policy {shape.record()['policy']}: eager "
        f"{ms['eager unread']:.3g} ms vs hand {ms['hand']:.3g} ms = {eager_ratio:.2f}x "
        f"(measuring support_loss_after too: {ms['eager']:.3g} ms); compiled "
        f"{ms['compiled']:.3g} ms vs hand compiled {ms['hand compiled']:.3g} ms = "
        f"{compiled_ratio:.2f}x; compile {learner_compile:.0f} s vs hand {hand_compile:.0f} s "
        f"(same parameters after one step: max difference {worst:.1e})"
    )
    measured = {**shape.record(), "calls": calls, "mode": mode}
    write_record(
        "learners",
        f"6-context-step-eager-{shape.name}",
        "MetaLearner.step (algorithm context) eager, support_loss_after not read, s per step "
        "(best of the calls)",
        times["eager unread"],
        "s",
        baseline=Baseline(
            "hand-written encoder + conditioned-policy step (grad of vmap, functional Adam), s",
            times["hand"],
        ),
        details={"with_support_loss_after_s": times["eager"], "max_param_difference": worst},
        shape=measured,
    )
    write_record(
        "learners",
        f"6-context-step-compiled-{shape.name}",
        f"MetaLearner.step (algorithm context) compiled (compile {mode!r}), s per step "
        "(best of the calls)",
        times["compiled"],
        "s",
        baseline=Baseline(
            "hand-written encoder + conditioned-policy step compiled whole, s",
            times["hand compiled"],
        ),
        details={
            "fallback": compiled.compiled_step.fallback,
            "compile_s": learner_compile,
            "hand_compile_s": hand_compile,
        },
        shape=measured,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run the 70k sinusoid run")
    parser.add_argument(
        "--quick", action="store_true", help="5: the sinusoid and one-task shapes only"
    )
    parser.add_argument(
        "--shapes",
        default=",".join(shape.name for shape in SHAPES),
        help="5: the shapes to measure, comma-separated (default: all)",
    )
    parser.add_argument("--device", default="cpu", help="device of 5 (cpu, cuda, cuda:N)")
    parser.add_argument(
        "--float32-matmul",
        choices=("ieee", "tf32"),
        default="ieee",
        help="5: MetaConfig.float32_matmul of the learners, and the hand-written steps' setting",
    )
    parser.add_argument(
        "--figures",
        default="1,2,3,5,6",
        help="the figures to run, comma-separated (default: 1,2,3,5,6; 4 is --full)",
    )
    parser.add_argument(
        "--mode", default=None, help="torch.compile mode of 5 (default: reduce-overhead on cuda)"
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch sees no CUDA device here")
    mode = args.mode or ("reduce-overhead" if device.type == "cuda" else "default")
    # Small kernels gain nothing from intra-op threads, and on a shared 2-core machine
    # spinning worker threads make every timing noisier.
    torch.set_num_threads(1)
    shapes = ["sinusoid", "one-task"] if args.quick else args.shapes.split(",")
    unknown = sorted(set(shapes) - {shape.name for shape in SHAPES})
    if unknown:
        parser.error(f"--shapes: unknown {unknown}; choose from {[s.name for s in SHAPES]}")
    figures = set(args.figures.split(","))
    if device.type == "cpu":
        for figure, bench in (
            ("1", bench_update_overhead),
            ("2", bench_vmap_vs_loop),
            ("3", bench_saved_memory),
        ):
            if figure in figures:
                bench()
    if "5" in figures:
        bench_meta_step(device, mode, shapes, args.float32_matmul)
    if "6" in figures and device.type == "cpu":
        bench_context_step(REACH, mode)
    if args.full:
        bench_sinusoid_full()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
