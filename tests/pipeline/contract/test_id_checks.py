"""Rows must form episodes across the whole dataset: each (eps_id, t) once, steps from 0
without gaps, end flags on the last step only, one task per episode. An episode is one
module's rows under one eps_id: modules (agents) may share eps_id and t. Episodes may span
files and rows may come in any order. Every test runs without Ray (``inspect_episodes``), on
both ways of checking: in memory, and over an external sort (a budget of one byte forces it
and spills every row group)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contract.id_findings import VALIDATION_MEMORY_MB
from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from tests.helpers.episode_files import episode_table, write

_PARTIAL_FIX = (
    "or pass allow_partial_episodes=True (--allow-partial-episodes, data.allow_partial_episodes) "
    "for a dataset that is knowingly partial"
)


BOUNDED_MB = 2**-20
"""A one-byte budget: the checks sort on disk, a run per row group."""


@pytest.fixture(params=["in memory", "sorted on disk"])
def memory_mb(request) -> float:
    return VALIDATION_MEMORY_MB if request.param == "in memory" else BOUNDED_MB


def _refused(source, memory_mb, **kwargs) -> str:
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(source, validation_memory_mb=memory_mb, **kwargs)
    return str(caught.value)


def _steps(eps_id, t, *, terminated=(), truncated=(), **columns) -> pa.Table:
    """Rows with these ``eps_id`` and ``t``; flags set on the given row positions."""
    flags = {}
    for name, positions in (("terminateds", terminated), ("truncateds", truncated)):
        flags[name] = pa.array(np.isin(np.arange(len(t)), positions))
    ids = pa.array(eps_id) if isinstance(eps_id[0], str) else pa.array(eps_id, pa.int64())
    columns = {"task_id": None, **flags, **columns}
    return episode_table(len(t), eps_id=ids, t=pa.array(t, pa.int32()), **columns)


@pytest.mark.parametrize("modules", [1, 3])
@pytest.mark.parametrize("id_type", [pa.int64(), pa.string()])
def test_episodes_may_span_files_in_any_row_order(tmp_path, memory_mb, id_type, modules):
    rng = np.random.default_rng(0)
    one = episode_table(60, episode_length=6, tasks=("a", "b", "c"))
    one = one.set_column(0, "eps_id", one.column("eps_id").cast(id_type))
    whole = pa.concat_tables(
        one.append_column("module_id", pa.array([f"m{m}"] * 60)) for m in range(modules)
    )
    shuffled = whole.take(rng.permutation(whole.num_rows))
    write(tmp_path / "a.parquet", shuffled.slice(0, 25 * modules))
    write(tmp_path / "b.parquet", shuffled.slice(25 * modules))

    info = inspect_episodes(tmp_path, validation_memory_mb=memory_mb)

    assert (info.num_rows, info.num_episodes, info.task_ids) == (60 * modules, 10, ("a", "b", "c"))
    assert info.module_ids == tuple(f"m{m}" for m in range(modules))


def test_repeated_transitions_across_files(tmp_path, memory_mb):
    a = write(tmp_path / "a.parquet", episode_table(6))
    b = write(tmp_path / "b.parquet", episode_table(6, first_episode=1))
    repeated = "; ".join(f"eps_id 1 t {t}: 2 rows in {a}, {b}" for t in range(3))
    assert _refused(tmp_path, memory_mb) == (
        f"source {str(tmp_path)!r}: 3 row(s) repeat an (eps_id, t) pair already present, "
        f"first: {repeated}; expected each (eps_id, t) once. Fix: drop the repeated rows (a "
        "recorder that rewrites earlier episodes into later files writes them)"
    )


def test_a_recorder_rewriting_episodes_names_the_first_five(tmp_path, memory_mb):
    files = [write(tmp_path / f"{n}.parquet", episode_table(12, episode_length=4)) for n in "abc"]
    every = ", ".join(map(str, files))
    first = [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    repeated = "; ".join(f"eps_id {e} t {t}: 3 rows in {every}" for e, t in first)
    message = _refused(tmp_path, memory_mb, allow_partial_episodes=True)
    assert message == (
        f"source {str(tmp_path)!r}: 24 row(s) repeat an (eps_id, t) pair already present, "
        f"first: {repeated}; expected each (eps_id, t) once. Fix: drop the repeated rows (a "
        "recorder that rewrites earlier episodes into later files writes them)"
    )


def _modules(*names: str) -> pa.Array:
    return pa.array(names).dictionary_encode()


@pytest.mark.parametrize("one_module", [False, True])
def test_repeated_transition_within_one_file(tmp_path, memory_mb, one_module):
    modules = {"module_id": _modules(*"aaaa")} if one_module else {}
    table = _steps(["e0"] * 4, [0, 1, 1, 2], terminated=[3], **modules)
    path = write(tmp_path / "p.parquet", table)
    assert _refused(path, memory_mb).startswith(
        f"source {str(path)!r}: 1 row(s) repeat an (eps_id, t) pair already present, first: "
        f"eps_id 'e0' t 1: 2 rows in {path}; expected"
    )


def test_modules_share_eps_id_and_t(tmp_path, memory_mb):
    """Multi-agent rows: one per (module_id, eps_id, t); an agent may end before another and
    follow its own task."""
    write(
        tmp_path / "a.parquet",
        _steps(
            [4, 4, 4, 4, 9],
            [0, 0, 1, 1, 0],
            terminated=[2],
            module_id=_modules(*"ababb"),
            task_id=_modules(*"xyxyx"),
        ),
    )
    write(
        tmp_path / "b.parquet",
        _steps(
            [4, 4, 9, 9],
            [3, 2, 1, 0],
            truncated=[0],
            module_id=_modules(*"bbba"),
            task_id=_modules(*"yyxz"),
        ),
    )

    info = inspect_episodes(tmp_path, validation_memory_mb=memory_mb)

    assert (info.num_rows, info.num_episodes, info.module_ids) == (9, 2, ("a", "b"))


def test_a_repeat_within_one_module_names_it(tmp_path, memory_mb):
    path = write(
        tmp_path / "p.parquet", _steps([4] * 5, [0, 0, 1, 1, 1], module_id=_modules(*"ababa"))
    )
    assert _refused(path, memory_mb) == (
        f"source {str(path)!r}: 1 row(s) repeat a (module_id, eps_id, t) triple already "
        f"present, first: module_id 'a' eps_id 4 t 1: 2 rows in {path}; expected each "
        "(module_id, eps_id, t) once. Fix: drop the repeated rows (a recorder that rewrites "
        "earlier episodes into later files writes them)"
    )


def test_a_gap_in_one_module_names_it(tmp_path, memory_mb):
    a = write(tmp_path / "a.parquet", _steps(["e"] * 3, [0, 0, 0], module_id=_modules(*"abc")))
    b = write(tmp_path / "b.parquet", _steps(["e"] * 3, [2, 2, 1], module_id=_modules(*"abc")))
    assert _refused(tmp_path, memory_mb) == (
        f"{b}: module_id 'a' eps_id 'e' jumps from t 0 to t 2 (t 0 is in {a}) (first of 2 "
        "episodes with missing steps); expected consecutive steps within an episode. Fix: write "
        f"the missing steps, {_PARTIAL_FIX}"
    )


def test_episode_not_starting_at_zero(tmp_path, memory_mb):
    path = write(tmp_path / "p.parquet", _steps([3, 3, 4, 4, 4], [1, 2, 0, 1, 2]))
    assert _refused(path, memory_mb) == (
        f"{path}: eps_id 3 starts at t 1; expected every episode to start at t 0. Fix: write "
        f"the episode's first steps, {_PARTIAL_FIX}"
    )
    several = write(tmp_path / "q.parquet", _steps(["x", "y", "y"], [5, 2, 3]))
    assert _refused(several, memory_mb).startswith(
        f"{several}: eps_id 'x' starts at t 5 (first of 2 episodes starting later); expected"
    )


def test_missing_steps_inside_an_episode(tmp_path, memory_mb):
    path = write(tmp_path / "p.parquet", _steps(["e0"] * 3 + ["e1"] * 2, [0, 1, 3, 0, 2]))
    assert _refused(path, memory_mb) == (
        f"{path}: eps_id 'e0' jumps from t 1 to t 3 (first of 2 episodes with missing steps); "
        f"expected consecutive steps within an episode. Fix: write the missing steps, "
        f"{_PARTIAL_FIX}"
    )


def test_missing_steps_between_files_name_both(tmp_path, memory_mb):
    a = write(tmp_path / "a.parquet", _steps([5, 5], [0, 1]))
    b = write(tmp_path / "b.parquet", _steps([5, 5], [3, 4], terminated=[1]))
    assert _refused(tmp_path, memory_mb) == (
        f"{b}: eps_id 5 jumps from t 1 to t 3 (t 1 is in {a}); expected consecutive steps "
        f"within an episode. Fix: write the missing steps, {_PARTIAL_FIX}"
    )


@pytest.mark.parametrize("flag", ["terminateds", "truncateds"])
def test_end_flag_before_the_last_step(tmp_path, memory_mb, flag):
    key = "terminated" if flag == "terminateds" else "truncated"
    path = write(tmp_path / "p.parquet", _steps([0] * 4, [0, 1, 2, 3], **{key: [1]}))
    assert _refused(path, memory_mb) == (
        f"{path}: eps_id 0 has {flag} set at t 1 but continues to t 3; expected episode-end "
        f"flags on an episode's last step only. Fix: clear the flag or split the episode, "
        f"{_PARTIAL_FIX}"
    )


def test_end_flag_with_the_episode_continued_in_another_file(tmp_path, memory_mb):
    a = write(tmp_path / "a.parquet", _steps([7, 7, 8], [0, 1, 0], truncated=[1, 2]))
    b = write(tmp_path / "b.parquet", _steps([7, 8, 8], [2, 1, 2], truncated=[2]))
    assert _refused(tmp_path, memory_mb) == (
        f"{a}: eps_id 7 has truncateds set at t 1 but continues to t 2 (t 2 is in {b}) (first "
        f"of 2 episodes with truncateds before their end); expected episode-end flags on an "
        f"episode's last step only. Fix: clear the flag or split the episode, {_PARTIAL_FIX}"
    )


def test_partial_episodes_are_accepted_when_asked(tmp_path, memory_mb):
    write(tmp_path / "a.parquet", _steps([0, 0, 0, 1], [2, 3, 7, 4], terminated=[1]))
    write(tmp_path / "b.parquet", _steps([1, 1], [5, 9], truncated=[0]))
    assert _refused(tmp_path, memory_mb).startswith(
        f"{tmp_path / 'a.parquet'}: eps_id 0 starts at t 2"
    )

    info = inspect_episodes(tmp_path, allow_partial_episodes=True, validation_memory_mb=memory_mb)

    assert (info.num_rows, info.num_episodes) == (6, 2)


def test_task_changing_within_an_episode(tmp_path, memory_mb):
    tasks = pa.array(["a", "a", "b", "c"]).dictionary_encode()
    path = write(tmp_path / "p.parquet", _steps([0, 0, 0, 1], [0, 1, 2, 0], task_id=tasks))
    assert _refused(path, memory_mb, allow_partial_episodes=True) == (
        f"{path}: eps_id 0 has task_id 'b' at t 2 but 'a' at t 1; expected one task per "
        "episode. Fix: give each task's episodes their own eps_id"
    )
