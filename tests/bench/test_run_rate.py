"""How ``bench/run_rate.py`` reads an ``offmeta run``'s output: the steady rate counts from
the first progress line after the compilation, the whole rate over the train stage's
seconds, and a run that fell back to eager is not counted as compiled. No timing here: the
outputs are written out, and the CPU times are the test process's own."""

from __future__ import annotations

import os

import pytest

from bench.run_rate import read_run, thread_cpu

_RUN = """\
23:59:58.000 | INFO    | Task run 'train-ae4' - task samples: {{'mode': 'memory'}}
{compile}23:59:59.500 | INFO    | Task run 'train-ae4' - iteration 100/400 (25%) | 2.6 it/s
00:00:01.500 | INFO    | Task run 'train-ae4' - iteration 200/400 (50%) | 4.7 it/s
00:00:05.500 | INFO    | Task run 'train-ae4' - iteration 400/400 (100%) | 6.4 it/s
{eager}took 90.0 s: 40.0 s before the flow (...), validate 0.2 s, train 20.0 s, evaluate 9.0 s
"""
_COMPILED = (
    "23:59:59.000 | INFO    | learners.meta.compiled_step - compiled the meta-step "
    "(mode 'default', 12 tasks) in 9.5 s; 1 compilation(s) so far\n"
)
_EAGER = (
    "00:00:02.000 | WARNING | learners.meta.compiled_step - MetaConfig.compile='default': "
    "compiling the meta-step failed: boom; the meta-step runs eager\n"
)


def test_the_steady_rate_counts_from_the_first_progress_line_after_compiling() -> None:
    run = read_run(
        _RUN.format(compile=_COMPILED, eager=""),
        cpu={100: {"main": 1.0}, 400: {"main": 4.0, "offmeta": 0.6}},
    )
    # 300 iterations from 23:59:59.5 to 00:00:05.5, across midnight.
    assert (run.first, run.last, run.steady) == (100, 400, pytest.approx(50.0))
    assert run.whole == pytest.approx(400 / 20.0)
    assert run.best_period == pytest.approx(50.0)  # 200 iterations in 4 s
    assert (run.compiled, run.compile_s, run.train_s) == (True, 9.5, 20.0)
    assert run.cpu_per_step == pytest.approx({"main": 0.01, "offmeta": 0.002})


def test_a_compilation_after_a_progress_line_moves_the_start() -> None:
    late = _RUN.format(compile="", eager="").replace(
        "00:00:01.500", _COMPILED.replace("23:59:59.000", "00:00:01.000") + "00:00:01.500"
    )
    run = read_run(late)
    assert (run.first, run.steady) == (200, pytest.approx(50.0))
    assert run.cpu_per_step is None


def test_a_run_that_fell_back_to_eager_is_not_compiled() -> None:
    assert not read_run(_RUN.format(compile=_COMPILED, eager=_EAGER)).compiled
    assert not read_run(_RUN.format(compile="", eager="")).compiled


def test_too_few_progress_lines_are_refused_with_the_fix() -> None:
    one = _RUN.format(compile=_COMPILED, eager="").split("00:00:01.500")[0] + "took 1 s: train 1 s"
    with pytest.raises(ValueError, match=r"found 1 progress lines .* log more often"):
        read_run(one)


def test_thread_cpu_names_the_main_thread() -> None:
    used = thread_cpu(os.getpid())
    assert "main" in used and all(seconds >= 0 for seconds in used.values())
