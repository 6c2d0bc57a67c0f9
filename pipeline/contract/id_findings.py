"""What the id checks report: the facts of a dataset that passed, and the refusals, worded
once for both ways of running the checks (``pipeline.contract.id_checks`` in memory,
``pipeline.contract.sorted_id_checks`` over an external sort).

A refusal names rows by ``RowAt``: the episode as messages show it, the step and the file,
so the wording never depends on how the rows were held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.contract.schema import DatasetError, EpisodeSchema

VALIDATION_MEMORY_MB = 1024.0
"""Default of ``data.validation_memory_mb``: the memory the id checks may use."""
FLAGS = ("terminateds", "truncateds")
SHOWN_DUPLICATES = 5
"""Repeated ``(module_id, eps_id, t)`` keys a refusal lists before it stops."""
_PARTIAL_FIX = (
    "or pass allow_partial_episodes=True (--allow-partial-episodes, data.allow_partial_episodes) "
    "for a dataset that is knowingly partial"
)


@dataclass(frozen=True)
class EpisodeIds:
    """What the id columns say about a dataset that passed the checks."""

    num_episodes: int
    """Distinct ``eps_id`` values (modules sharing one count it once)."""
    task_ids: tuple[str, ...]
    module_ids: tuple[str, ...]


@dataclass(frozen=True)
class RowAt:
    """One row, as a refusal names it."""

    episode: str
    """``eps_id 4``, or ``module_id 'a' eps_id 4`` when the dataset has several modules."""
    t: int
    file: str


@dataclass(frozen=True)
class Repeat:
    """The rows sharing one ``(module_id, eps_id, t)``."""

    first: RowAt
    rows: int
    files: tuple[str, ...]
    """The files holding them, in row order, each once."""


def episode_label(eps_id: int | str, module_id: str | None) -> str:
    """The episode in messages: its ``eps_id``, after its module when there are several."""
    if module_id is None:
        return f"eps_id {eps_id!r}"
    return f"module_id {module_id!r} eps_id {eps_id!r}"


def duplicates_error(
    description: str, count: int, shown: Sequence[Repeat], several_modules: bool
) -> DatasetError:
    """``count`` rows repeat a key; ``shown``: the first ``SHOWN_DUPLICATES`` keys."""
    listed = [
        f"{repeat.first.episode} t {repeat.first.t}: {repeat.rows} rows in "
        f"{', '.join(repeat.files)}"
        for repeat in shown
    ]
    key = "(module_id, eps_id, t)" if several_modules else "(eps_id, t)"
    kind = f"a {key} triple" if several_modules else "an (eps_id, t) pair"
    return DatasetError(
        f"source {description!r}: {count} row(s) repeat {kind} already present, "
        f"first: {'; '.join(listed)}; expected each {key} once. Fix: drop the repeated rows (a "
        "recorder that rewrites earlier episodes into later files writes them)"
    )


def task_change_error(
    before: RowAt, after: RowAt, task_before: str, task_after: str
) -> DatasetError:
    return DatasetError(
        f"{after.file}: {after.episode} has task_id {task_after!r} at t {after.t} but "
        f"{task_before!r} at t {before.t}{_also_in(before, after)}; expected one task per "
        "episode. Fix: give each task's episodes their own eps_id"
    )


def late_start_error(first: RowAt, count: int) -> DatasetError:
    """``count`` episodes start after ``t = 0``; ``first`` is the first one's first row."""
    return DatasetError(
        f"{first.file}: {first.episode} starts at t {first.t}"
        f"{_of_episodes(count, 'starting later')}; expected every episode to start at "
        f"t 0. Fix: write the episode's first steps, {_PARTIAL_FIX}"
    )


def gap_error(before: RowAt, after: RowAt, count: int) -> DatasetError:
    """``count`` episodes miss steps; the first jumps from ``before`` to ``after``."""
    return DatasetError(
        f"{after.file}: {after.episode} jumps from t {before.t} to "
        f"t {after.t}{_also_in(before, after)}"
        f"{_of_episodes(count, 'with missing steps')}; expected consecutive steps within an "
        f"episode. Fix: write the missing steps, {_PARTIAL_FIX}"
    )


def early_end_error(flag: str, row: RowAt, last: RowAt, count: int) -> DatasetError:
    """``count`` episodes set ``flag`` before their last row; the first sets it at ``row``
    and ends at ``last``."""
    return DatasetError(
        f"{row.file}: {row.episode} has {flag} set at t {row.t} but "
        f"continues to t {last.t}{_also_in(last, row)}"
        f"{_of_episodes(count, f'with {flag} before their end')}; expected episode-end flags "
        f"on an episode's last step only. Fix: clear the flag or split the episode, "
        f"{_PARTIAL_FIX}"
    )


def _of_episodes(count: int, what: str) -> str:
    return "" if count == 1 else f" (first of {count} episodes {what})"


def _also_in(seen: RowAt, here: RowAt) -> str:
    """Where another row of the same episode lives, when that is another file."""
    if seen.file == here.file:
        return ""
    return f" (t {seen.t} is in {seen.file})"


def id_columns(schema: EpisodeSchema) -> tuple[list[str], list[str]]:
    """The columns the id checks read: canonical names, and the same on disk."""
    canonical = ["eps_id", "t", *FLAGS]
    canonical += ["task_id"] if schema.has_task_id else []
    canonical += ["module_id"] if schema.has_module_id else []
    return canonical, [schema.column_map.get(c, c) for c in canonical]
