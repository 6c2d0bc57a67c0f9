"""The whole meta-step as one compiled function (`MetaConfig.compile`).

`build_meta_step(parts)` makes the pure function
`meta_step(state, support, query) -> (state, metrics)` from the learner's own pieces: its
vmapped task objective (inner updates, query losses), the meta-gradient by
`torch.func.grad` (a `.backward()` would split the function in two), its step metrics, and
the pure outer update of `learners.meta.outer_step` (clipping, non-finite policies, Adam or SGD).
`CompiledMetaStep` compiles that function once with `torch.compile(fullgraph=True,
dynamic=False)`, feeds it the live state, and writes the new state back in place. Before
each call dynamo checks guards on the function's arguments and the ambient state only, not
on the learner it closes over (`_kept_guards`), and each learner compiles its own copy of
the function (`_own_code`): its config and models are those it was built with.

Meta-batches of the same shapes reuse the compiled code; each compilation is counted and
its time logged. A configuration that cannot compile, or a compilation that fails, logs a
warning with the reason and the learner runs eager from then on (`fallback`); the failed
call changed nothing, so that step runs eager too.
"""

from __future__ import annotations

import functools
import logging
import re
import time
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import Tensor

from learners.meta.meta_batch import MetaBatch
from learners.meta.outer_step import InnerCheck, OuterState, OuterStep, copy_state, outer_update
from learners.params import Batch, Params
from learners.torch_compat import dynamo_error, graphs_compiled, inductor_mode_options

if TYPE_CHECKING:
    from learners.torch_compat import GuardFilterEntry

_log = logging.getLogger(__name__)
# The compiled function's arguments: their guards stay (`_kept_guards`).
_ARGUMENTS = ("state", "support", "query")
_ROOT = re.compile(r"(?:L\[['\"])?(\w*)")

Aux = dict[str, Tensor]
StepMetrics = dict[str, Tensor | int]
MetaStep = Callable[[OuterState, Batch, Batch], tuple[OuterState, StepMetrics]]


class MetaStepParts(NamedTuple):
    """What a meta-step is built from: the meta-learner's own pieces."""

    prepare: Callable[[MetaBatch], tuple[Batch, Batch, int]]
    """Checks a meta-batch at the boundary: (support, query, number of tasks)."""
    objective: Callable[[Params, dict[str, Tensor], Batch, Batch], tuple[Tensor, Aux]]
    """Vmapped over tasks: per-task meta-objective [tasks] and per-module aux values."""
    outcome: Callable[[Aux, int], tuple[StepMetrics, InnerCheck | None]]
    """Step metrics from the aux values, and what the inner updates met."""
    params: Params
    """The live meta-parameters of every module (the frozen ones enter as they are)."""
    trained: list[str]
    """Trained modules: their parameters, in order, are the first leaves."""
    log_lr_keys: list[str]
    """Learned log learning rates: the remaining leaves, in order."""
    outer: OuterStep
    lr_stats: Callable[[list[Tensor]], dict[str, Tensor]]
    """Statistics of learned log learning rates (empty without them), taken after the update."""


def build_meta_step(parts: MetaStepParts) -> MetaStep:
    """The pure meta-step: the next outer state and the step metrics from the current state
    and one (checked) meta-batch, reading nothing back from the device."""
    names = [(m, n) for m in parts.trained for n in parts.params[m]]
    frozen = {m: named for m, named in parts.params.items() if m not in parts.trained}
    rule = parts.outer.rule

    def meta_loss(
        trained: Params, log_lrs: dict[str, Tensor], support: Batch, query: Batch
    ) -> tuple[Tensor, Aux]:
        totals, aux = parts.objective({**frozen, **trained}, log_lrs, support, query)
        return totals.mean(), aux

    meta_gradient = torch.func.grad(meta_loss, argnums=(0, 1), has_aux=True)

    def meta_step(state: OuterState, support: Batch, query: Batch) -> tuple[OuterState, Any]:
        trained: Params = {}
        for (module_id, name), leaf in zip(names, state.leaves, strict=False):
            trained.setdefault(module_id, {})[name] = leaf
        log_lrs = dict(zip(parts.log_lr_keys, state.leaves[len(names) :], strict=True))
        (grads, log_lr_grads), aux = meta_gradient(trained, log_lrs, support, query)
        flat = [grads[m][n] for m, n in names] + [log_lr_grads[k] for k in parts.log_lr_keys]
        metrics, inner = parts.outcome(aux, _num_tasks(support))
        new, outer_metrics = outer_update(rule, state, flat, inner)
        metrics.update(outer_metrics)
        metrics.update(parts.lr_stats(new.leaves[len(names) :]))
        return new, metrics

    return meta_step


class CompiledMetaStep:
    """`build_meta_step` compiled in `mode` (its inductor options), run on the live state.

    `unsupported` is a reason known before compiling that this learner cannot use it.
    """

    def __init__(self, mode: str, parts: MetaStepParts, *, unsupported: str | None = None):
        self.mode = mode
        self.compilations = 0
        """Graphs compiled so far (one per distinct meta-batch shape)."""
        self.compile_seconds = 0.0
        """Wall time of the calls that compiled, first run included."""
        self.fallback: str | None = None
        """Why the learner runs eager, once it does."""
        self._prepare = parts.prepare
        self._outer = parts.outer
        meta_step = build_meta_step(parts)
        # CUDA graphs replay into fixed output buffers, and keep mutated inputs out of their
        # graphs: there the new state comes out and is copied in after the call. Otherwise
        # the compiled code writes it in place (the copies fuse into its kernels).
        self._reduce_overhead = mode == "reduce-overhead"
        options = {**_inductor_options(mode), "guard_filter_fn": _kept_guards}
        compile_ = functools.partial(torch.compile, options=options, fullgraph=True, dynamic=False)
        if self._reduce_overhead:
            self._run = _writing_after(compile_(_own_code(meta_step)), parts.outer)
        else:
            self._run = compile_(_own_code(_writing_in_place(meta_step)))
        if unsupported is not None:
            self._fall_back(unsupported)

    def step(self, meta_batch: MetaBatch) -> StepMetrics | None:
        """One compiled meta-step; its metrics, or None when the learner runs eager (then
        this call changed nothing)."""
        if self.fallback is not None:
            return None
        support, query, num_tasks = self._prepare(meta_batch)
        live = self._outer.state()
        # CUDA graphs replay into the same output buffers: the outputs are copied out below,
        # before the next replay.
        cuda_graphs = self._reduce_overhead and live.seq_no.is_cuda
        if cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        graphs = graphs_compiled()
        started = time.perf_counter()
        try:
            metrics = self._run(live, support, query)
        except dynamo_error() as error:
            self._fall_back(f"compiling the meta-step failed: {_first_line(error)}")
            return None
        if graphs_compiled() != graphs:
            self._record_compilation(
                graphs_compiled() - graphs, time.perf_counter() - started, num_tasks
            )
        if cuda_graphs:
            metrics = {k: v.clone() if isinstance(v, Tensor) else v for k, v in metrics.items()}
        return metrics

    def _record_compilation(self, graphs: int, seconds: float, num_tasks: int) -> None:
        self.compilations += graphs
        self.compile_seconds += seconds
        _log.info(
            "compiled the meta-step (mode %r, %d tasks) in %.1f s; %d compilation(s) so far",
            self.mode,
            num_tasks,
            seconds,
            self.compilations,
        )

    def _fall_back(self, reason: str) -> None:
        self.fallback = reason
        _log.warning("MetaConfig.compile=%r: %s; the meta-step runs eager", self.mode, reason)


def _writing_in_place(meta_step: MetaStep) -> Callable[[OuterState, Batch, Batch], StepMetrics]:
    """`meta_step` that copies the new state into the state it was given; returns metrics."""

    def step_in_place(state: OuterState, support: Batch, query: Batch) -> StepMetrics:
        new, metrics = meta_step(state, support, query)
        with torch.no_grad():
            copy_state(state, new)
        return metrics

    return step_in_place


def _writing_after(
    compiled: MetaStep, outer: OuterStep
) -> Callable[[OuterState, Batch, Batch], StepMetrics]:
    """`compiled`, then its new state copied into the state it was given; returns metrics."""

    def step_then_write(state: OuterState, support: Batch, query: Batch) -> StepMetrics:
        new, metrics = compiled(state, support, query)
        outer.write(state, new)
        return metrics

    return step_then_write


def _own_code(function: Callable) -> Callable:
    """`function` with a code object of its own.

    Dynamo keeps compiled code per code object, and every learner's meta-step function
    shares one; the guards that told learners apart are left out (`_kept_guards`), so each
    learner compiles its own copy: another learner's graph, built with its config and
    models, never runs here. (torch 2.13's `isolate_recompiles` does the same, but older
    torch versions, which GPU machines may run, lack it.)
    """
    return types.FunctionType(
        function.__code__.replace(),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )


def _inductor_options(mode: str) -> dict[str, Any]:
    """Inductor's options for `mode`, without loop reordering after fusion: with that pass,
    torch 2.11's inductor failed an assertion (`reorder_loops_by_dep_pair`) compiling the
    meta-step of 64 tasks on a 20-256-256-6 net for an H200 (bench/learners.py, large shape),
    in both modes; without it the step compiles."""
    return {**inductor_mode_options(mode), "loop_ordering_after_fusion": False}


def _kept_guards(guards: list[GuardFilterEntry]) -> list[bool]:
    """Which of dynamo's guards the compiled meta-step checks before each call: every
    tensor's metadata (shapes, strides, dtypes, devices: one compilation per meta-batch
    shape), the structure of its arguments (modules, columns, optimizer slots), and the
    ambient state (grad mode, functorch, default device, deterministic algorithms).

    Left out: the hundreds of guards on what the function closes over (the learner's
    models, inner rule and config, the outer rule) and on module globals. Those are fixed
    when the learner is built, as its optimizer's param groups and the outer rule already
    are, and checking them cost more per step than the rest of the step's overhead (about
    100 us of a 0.5 ms CPU step, measured).
    """
    return [
        guard.guard_type == "TENSOR_MATCH" or not guard.name or _root(guard.name) in _ARGUMENTS
        for guard in guards
    ]


def _root(name: str) -> str:
    """The name a guard's source starts from: an argument, a closure cell, G (globals)...
    (torch 2.13 names a local `state[...]`; its guard logs, and older versions, `L['state']`)."""
    return _ROOT.match(name).group(1)  # type: ignore[union-attr]  # matches every string


def _num_tasks(batch: Batch) -> int:
    columns: Mapping[str, Tensor] = next(iter(batch.values()))
    return next(iter(columns.values())).shape[0]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
