"""Episode selection (``episodes_where``): keep only the episodes whose columns match.

A filter is a list of conditions on columns of the dataset (pass-through columns such as a
``behavior`` label or a ``success`` flag, or canonical ones), all of which an episode must
meet to be kept. Each condition is decided per episode, over all of its rows:

- ``in: [v, ...]``: every row's value is one of the values (for a per-episode label, the
  label is);
- ``not_in: [v, ...]``: no row's value is one of them;
- ``ever: v``: some row's value equals ``v`` (``ever: true`` on ``success``: the episode
  succeeded at some step).

A null value matches no ``in`` and no ``ever``, and is not among ``not_in``'s values.

``select_episodes`` decides it in one pass over the id columns and the condition columns
only, row group by row group: each row group is reduced with Arrow's ``group_by`` to one
row per (episode, task, module), and those partial rows are reduced again at the end, so
memory grows with the number of episodes, never with the rows or the data columns. The
result, an ``EpisodeSelection``, holds the ids of the episodes kept; every read of the
dataset keeps their rows only (``EpisodeSelection.keep`` for a table, ``is_in`` in a Ray
Data filter), so the rows of episodes left out never reach a task sample or a minibatch.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.contract.schema import DEFAULT_MODULE_ID, DEFAULT_TASK_ID, DatasetError, EpisodeSchema
from pipeline.io.arrow_columns import decoded
from pipeline.io.dataset_source import ResolvedSource, uri_of

ConditionKind = Literal["in", "not_in", "ever"]
_AGGREGATE = {"in": "all", "not_in": "all", "ever": "any"}
_MERGE_EVERY = 256
"""Partial rows are reduced again once this many row groups have been read."""


@dataclass(frozen=True)
class EpisodeCondition:
    """One condition of ``episodes_where`` (see the module)."""

    column: str
    kind: ConditionKind
    values: tuple[Any, ...]
    """The values of ``in`` / ``not_in``; for ``ever``, its one value."""

    def describe(self) -> str:
        """``behavior in ['expert']``, ``success ever True``."""
        shown = repr(self.values[0]) if self.kind == "ever" else repr(list(self.values))
        return f"{self.column} {self.kind.replace('_', ' ')} {shown}"


@dataclass(frozen=True)
class EpisodeFilter:
    """What ``episodes_where`` asks for: conditions all of which an episode meets."""

    conditions: tuple[EpisodeCondition, ...]
    label: str = "episodes_where"
    """Where the filter was set, for messages (``data.episodes_where.train``)."""


@dataclass(frozen=True)
class EpisodeSelection:
    """The episodes a filter keeps, for every read of one dataset."""

    where: EpisodeFilter
    kept: pa.Array = field(repr=False)
    """Ids of the episodes kept (the type of ``eps_id``), sorted."""
    episodes: int
    """Episodes in the dataset before selection."""
    rows: int
    """Rows of the episodes kept."""
    total_rows: int
    sizes: dict[tuple[str, str], int] = field(repr=False)
    """(module, task) -> rows kept."""

    def keep(self, table: pa.Table) -> pa.Table:
        """The rows of ``table`` (with a canonical ``eps_id`` column) of episodes kept."""
        return table.filter(pc.is_in(table.column("eps_id"), value_set=self.kept))

    def summary(self) -> dict[str, Any]:
        """Plain JSON for lineage and the evaluation report."""
        return {
            "where": [condition.describe() for condition in self.where.conditions],
            "episodes": len(self.kept),
            "of_episodes": self.episodes,
            "rows": self.rows,
            "of_rows": self.total_rows,
        }


def select_episodes(
    resolved: ResolvedSource,
    types: Mapping[str, pa.DataType],
    schema: EpisodeSchema,
    episode_filter: EpisodeFilter,
) -> EpisodeSelection:
    """Decide which episodes of a validated dataset ``episode_filter`` keeps (see the module).

    ``types`` are the footer's column types (canonical names, or names on disk for columns
    outside the contract). Raises ``DatasetError`` in one line, prefixed with its ``label``,
    when a condition names a column the files do not have or a value its type cannot hold,
    and when the filter keeps no episode of some task (naming the task).
    """
    where, label = episode_filter.conditions, episode_filter.label
    if not where:
        raise ValueError(f"{label}: expected at least one condition")
    root = uri_of(resolved.filesystem, resolved.root)
    value_sets = [_value_set(condition, types, label, root) for condition in where]
    on_disk = {name: schema.column_map.get(name, name) for name in _id_names(schema)}
    for condition in where:
        on_disk.setdefault(
            condition.column, schema.column_map.get(condition.column, condition.column)
        )
    keys = list(_id_names(schema))
    partials: list[pa.Table] = []
    for table in _row_groups(resolved, list(dict.fromkeys(on_disk.values()))):
        columns = {name: decoded(table.column(on_disk[name])) for name in keys}
        for index, (condition, values) in enumerate(zip(where, value_sets, strict=True)):
            columns[f"c{index}"] = _matches(
                decoded(table.column(on_disk[condition.column])), condition, values
            )
        partials.append(_reduce(pa.table(columns), keys, where, "count_all"))
        if len(partials) >= _MERGE_EVERY:
            partials = [_reduce(pa.concat_tables(partials), keys, where, "sum")]
    per_group = _reduce(pa.concat_tables(partials), keys, where, "sum")
    per_episode = per_group.group_by("eps_id").aggregate(
        [(f"c{i}", _AGGREGATE[condition.kind]) for i, condition in enumerate(where)]
    )
    met = [per_episode.column(f"c{i}_{_AGGREGATE[c.kind]}") for i, c in enumerate(where)]
    mask = met[0]
    for more in met[1:]:
        mask = pc.and_(mask, more)
    kept_ids = pc.unique(per_episode.filter(mask).column("eps_id").combine_chunks()).sort()
    rows = per_group.filter(pc.is_in(per_group.column("eps_id"), value_set=kept_ids))
    _refuse_empty_tasks(per_group, rows, schema, where, label, root)
    return EpisodeSelection(
        where=episode_filter,
        kept=kept_ids,
        episodes=per_episode.num_rows,
        rows=int(pc.sum(rows.column("rows")).as_py() or 0),
        total_rows=int(pc.sum(per_group.column("rows")).as_py() or 0),
        sizes=_sizes(rows, schema),
    )


def _sizes(rows: pa.Table, schema: EpisodeSchema) -> dict[tuple[str, str], int]:
    """(module, task) -> rows, from one row per (episode, task, module)."""
    keys = [name for name in ("module_id", "task_id") if getattr(schema, f"has_{name}")]
    if not keys:
        return {(DEFAULT_MODULE_ID, DEFAULT_TASK_ID): int(pc.sum(rows.column("rows")).as_py() or 0)}
    sizes = {}
    for row in rows.group_by(keys).aggregate([("rows", "sum")]).to_pylist():
        key = (row.get("module_id", DEFAULT_MODULE_ID), row.get("task_id", DEFAULT_TASK_ID))
        sizes[key] = row["rows_sum"]
    return dict(sorted(sizes.items()))


def _id_names(schema: EpisodeSchema) -> tuple[str, ...]:
    ids = [name for name in ("task_id", "module_id") if getattr(schema, f"has_{name}")]
    return ("eps_id", *ids)


def _value_set(
    condition: EpisodeCondition, types: Mapping[str, pa.DataType], label: str, root: str
) -> pa.Array:
    column = condition.column
    if column not in types:
        raise DatasetError(
            f"{label}: column {column!r} is not in dataset {root} (its columns: "
            f"{', '.join(sorted(types))}); expected a column of every file, such as a "
            "pass-through behaviour label"
        )
    arrow_type = types[column]
    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if isinstance(arrow_type, pa.BaseExtensionType) or pa.types.is_nested(arrow_type):
        raise DatasetError(
            f"{label}: column {column!r} of dataset {root} holds {arrow_type} values; expected "
            "a column of single values (string, number or bool) to select episodes by"
        )
    for value in condition.values:
        try:
            pa.array([value], type=arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError):
            raise DatasetError(
                f"{label}: {condition.describe()}: value {value!r} is not a {arrow_type} like "
                f"column {column!r} of dataset {root}; expected values of that type"
            ) from None
    return pa.array(list(condition.values), type=arrow_type)


def _matches(
    values: pa.ChunkedArray | pa.Array, condition: EpisodeCondition, value_set: pa.Array
) -> pa.ChunkedArray | pa.Array:
    """Per row, whether it meets ``condition`` (reduced per episode by ``_AGGREGATE``)."""
    found = pc.is_in(values, value_set=value_set)  # a null row is in no set
    return pc.invert(found) if condition.kind == "not_in" else found


def _reduce(
    table: pa.Table, keys: list[str], where: Sequence[EpisodeCondition], count: str
) -> pa.Table:
    """One row per (episode, task, module): its rows and each condition's all/any."""
    aggregates: list[tuple[Any, ...]] = [
        (f"c{i}", _AGGREGATE[condition.kind]) for i, condition in enumerate(where)
    ]
    aggregates.append(([], "count_all") if count == "count_all" else ("rows", "sum"))
    reduced = table.group_by(keys).aggregate(aggregates)
    names = {f"c{i}_{_AGGREGATE[c.kind]}": f"c{i}" for i, c in enumerate(where)}
    names.update({"count_all": "rows", "rows_sum": "rows"})
    return reduced.rename_columns([names.get(name, name) for name in reduced.column_names])


def _refuse_empty_tasks(
    every: pa.Table,
    kept: pa.Table,
    schema: EpisodeSchema,
    where: Sequence[EpisodeCondition],
    label: str,
    root: str,
) -> None:
    tasks = every.column("task_id") if schema.has_task_id else None
    if tasks is None:
        if kept.num_rows == 0:
            raise DatasetError(_empty_message(label, DEFAULT_TASK_ID, every, where, root))
        return
    left = set(kept.column("task_id").to_pylist())
    empty = sorted(set(tasks.to_pylist()) - left)
    if empty:
        of_task = every.filter(pc.equal(tasks, empty[0]))
        more = f" (and of {len(empty) - 1} more tasks)" if len(empty) > 1 else ""
        raise DatasetError(_empty_message(label, empty[0], of_task, where, root, more))


def _empty_message(
    label: str,
    task: str,
    of_task: pa.Table,
    where: Sequence[EpisodeCondition],
    root: str,
    more: str = "",
) -> str:
    episodes = len(pc.unique(of_task.column("eps_id")))
    conditions = " and ".join(condition.describe() for condition in where)
    return (
        f"{label} keeps no episode of task {task!r} in dataset {root} (none of its {episodes} "
        f"episodes has {conditions}){more}; loosen the filter, or leave the task out of the dataset"
    )


def _row_groups(resolved: ResolvedSource, columns: list[str]) -> Iterator[pa.Table]:
    for path in resolved.files:
        with resolved.filesystem.open_input_file(path) as handle:
            parquet = pq.ParquetFile(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=columns)
