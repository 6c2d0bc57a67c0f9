"""Check the numbers: no NaN or inf in the float columns, discrete actions never negative
(they are indices) and inside the declared ``action_space``; float actions outside a
declared box are counted, not refused.
uint8 image observations cannot hold NaN or inf, so they are not read.

A NaN reward silently poisons every return and every weight computed from it, and an
action index ``< 0`` or ``>= n`` fails deep inside a loss (or, negative, silently indexes
from the end), so both are refused here, naming the file,
the column, how many rows and the first one. Recorders often store a continuous action
before the environment clips it, so a box's ``low``/``high`` only draws a warning.

Footer statistics decide only where they are conclusive. pyarrow (checked with 26.0) leaves
NaN out of a float column's min/max and counts no NaN (a row group of NaN only has no
min/max), so statistics never clear a float column: those are scanned. An int64
``actions`` row group whose min and max lie in ``[0, n)`` (``>= 0`` without a declared
``n``) is cleared without reading it.

The scan reads file by file, row group by row group, only the value columns, and checks the
flat float32 storage of each tensor column with numpy: memory stays at one row group's value
columns. ``check_values`` (``CheckValues``): ``full`` checks every row group; ``sample`` one
row group in ``SAMPLE_EVERY``, counted across the dataset in file order from the first;
``off`` none.

When that scan did not cover every row (``sample``, ``off``), the reads that feed training
check what they read (``check_read_values``): one vectorised pass over the float columns of
each table read, and over discrete actions (their minimum and maximum, against 0 and a
declared ``action_space.n``), and only when it finds a NaN, an inf or an action out of range are
the files read scanned again, as ``full`` would have, for the message validation gives.
After ``full`` the reads check nothing (``ValueFacts.every_row``).

The same pass gathers the statistics ``data.normalize`` asks for (``normalize``: float
columns, per feature, and ``returns``, the return-to-go of the rewards read, episode by
episode; ``pipeline.contract.feature_stats``) over the rows it reads: every row
with ``full``, the sampled row groups' with ``sample``; with ``kept_episodes`` (the ids an
``episodes_where`` selection keeps) only those episodes' rows count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pipeline.contract.dataset_json import Space
from pipeline.contract.feature_stats import FeatureStats, ReturnsAccumulator, StatsAccumulator
from pipeline.contract.footer_checks import FileFacts, column_label
from pipeline.contract.returns_to_go import RETURNS_COLUMN as RETURNS
from pipeline.contract.schema import CheckValues, DatasetError, EpisodeSchema
from pipeline.io.arrow_columns import decoded
from pipeline.io.dataset_source import METADATA_FILE, ResolvedSource
from pipeline.io.parquet_files import leaf_index

SAMPLE_EVERY = 16
_VALUE_COLUMNS = ("obs", "new_obs", "actions", "rewards")


@dataclass(frozen=True)
class ValueFacts:
    """What the value checks covered and found, for a dataset that passed them."""

    check_values: CheckValues
    rows: int
    """Rows whose values were checked: scanned, or cleared by footer statistics."""
    actions_outside_box: int = 0
    """Rows whose float action has a component outside ``action_space``'s low/high."""
    warning: str | None = None
    """One line about those rows; ``None`` when there are none."""
    discrete_n: int | None = None
    """``action_space.n`` that discrete actions must lie below, when declared."""
    space_file: str = ""
    """The ``dataset.json`` declaring the action space, for the reads' messages."""
    stats: dict[str, FeatureStats] = field(default_factory=dict)
    """Column -> per-feature statistics of the rows scanned, for the columns ``normalize``
    named."""

    @property
    def every_row(self) -> bool:
        """Whether every row group was scanned (``full``): reads need not check again."""
        return self.check_values == "full"


@dataclass(frozen=True)
class _Rules:
    floats: tuple[str, ...]
    """Canonical float columns (float actions among them) that must be finite."""
    discrete: bool
    """Actions are int64 indices: refused below 0, and from ``discrete_n`` up."""
    discrete_n: int | None
    """``action_space.n`` of discrete actions, when declared."""
    low: float | None
    high: float | None
    """Bounds of a declared box action space (either may be absent)."""
    space_file: str
    """The ``dataset.json`` that declares the action space, for messages."""


@dataclass
class _Found:
    """Offending rows of one column in one file."""

    rows: int = 0
    group: int = -1
    """Row group of the first one, and its position there."""
    position: int = -1
    value: object = None
    """The first offending value, for discrete actions."""

    def add(self, mask: np.ndarray, group: int, values: np.ndarray | None = None) -> None:
        count = int(np.count_nonzero(mask))
        if count and self.group < 0:
            self.group, self.position = group, int(np.argmax(mask))
            self.value = None if values is None else values[self.position].item()
        self.rows += count


def check_value_columns(
    resolved: ResolvedSource,
    facts: Sequence[FileFacts],
    schema: EpisodeSchema,
    action_space: Space | None,
    check: CheckValues = "full",
    normalize: Sequence[str] = (),
    kept_episodes: pa.Array | None = None,
    gamma: float = 0.99,
) -> ValueFacts:
    """Refuse non-finite floats and out-of-range discrete actions (see module doc), and
    gather the statistics of the float columns ``normalize`` names, and of ``returns``
    (the return-to-go at discount ``gamma``, from the rewards read) when it names that.

    Raises ``DatasetError`` naming the file, the column, the number of offending rows and
    the first one (``eps_id``, ``t``).
    """
    rules = _rules(schema, action_space, f"{resolved.root.rstrip('/')}/{METADATA_FILE}")
    unread = [c for c in normalize if c not in (*rules.floats, RETURNS)]
    if unread or (normalize and check == "off"):
        raise DatasetError(
            f"normalize {list(normalize)}: statistics come from the float columns the value "
            f"checks scan ({', '.join(rules.floats)}; uint8 images are not standardised) and "
            f"returns, with check_values full or sample, got check_values {check}; expected "
            "those columns and check_values full or sample"
        )
    columns = {c: StatsAccumulator() for c in normalize if c != RETURNS}
    returns = ReturnsAccumulator(gamma) if RETURNS in normalize else None
    stats = _Stats(columns, kept_episodes, returns)
    if check == "off":
        return ValueFacts("off", 0, discrete_n=rules.discrete_n, space_file=rules.space_file)
    checked, outside, first_outside = 0, 0, ""
    before = 0
    total = sum(fact.num_rows for fact in facts)
    for fact in facts:
        groups = [
            g for g in range(fact.row_groups) if check == "full" or (before + g) % SAMPLE_EVERY == 0
        ]
        before += fact.row_groups
        if not groups:
            continue
        scan = _check_file(resolved.filesystem, fact, groups, schema, rules, check, stats)
        checked += scan.rows
        if scan.outside and not first_outside:
            first_outside = scan.first_outside
        outside += scan.outside
    warning = None
    if outside:
        low = "-inf" if rules.low is None else rules.low
        high = "inf" if rules.high is None else rules.high
        warning = (
            f"column {column_label('actions', schema.column_map)} has components outside "
            f"action_space's bounds [{low}, {high}] ({rules.space_file}) in {outside} of "
            f"{_of_rows(checked, total, check)}, first in {first_outside}; kept as recorded "
            "(recorders often store actions before the environment clips them)"
        )
    return ValueFacts(
        check,
        checked,
        outside,
        warning,
        rules.discrete_n,
        rules.space_file,
        stats.results(),
    )


def check_read_values(
    table: pa.Table,
    files: Sequence[str],
    filesystem: pafs.FileSystem,
    schema: EpisodeSchema,
    values: ValueFacts,
) -> None:
    """Refuse ``table`` (canonical columns read from ``files``) when a float column holds
    NaN or inf, or a discrete action lies outside ``[0, action_space.n)``, with the message a
    ``full`` validation of those files gives.

    For the reads of a dataset whose validation did not scan every row (``values``, what it
    covered; ``ValueFacts.every_row``): ``table`` is checked in one vectorised pass, and only
    when it holds an offending value are ``files`` scanned, in order, for the file, the count
    and the first row to name.
    """
    floats = _rules(schema, None, "").floats
    flagged = tuple(
        c for c in floats if c in table.column_names and not _all_finite(table.column(c))
    )
    n = values.discrete_n
    out_of_range = schema.discrete_actions and "actions" in table.column_names
    out_of_range = out_of_range and not _all_in_range(table.column("actions"), n)
    if not flagged and not out_of_range:
        return
    rules = _Rules(flagged, out_of_range, n, None, None, values.space_file)
    for path in files:
        metadata = pq.read_metadata(path, filesystem=filesystem)
        fact = FileFacts(path, metadata.num_rows, {}, row_groups=metadata.num_row_groups)
        _check_file(filesystem, fact, list(range(fact.row_groups)), schema, rules, "full")
    found = []
    if flagged:
        labels = ", ".join(column_label(c, schema.column_map) for c in flagged)
        found.append(f"{labels} held non-finite values (NaN or inf)")
    if out_of_range:
        outside = f"actions outside [0, {n})" if n is not None else "negative actions"
        found.append(f"{column_label('actions', schema.column_map)} held {outside}")
    raise DatasetError(
        f"{', '.join(files)}: {' and '.join(found)} when read for training, but none when "
        "scanned again: the files changed while they were read; expected the files that were "
        "validated. Fix: validate them again and rerun"
    )


def _rules(schema: EpisodeSchema, action_space: Space | None, space_file: str) -> _Rules:
    floats = [c for c in _VALUE_COLUMNS if c != "new_obs" or schema.has_new_obs]
    if schema.obs_layout is not None:
        # uint8 images hold no NaN or inf: nothing to scan.
        floats = [c for c in floats if c not in ("obs", "new_obs")]
    discrete_n = low = high = None
    if schema.discrete_actions:
        floats.remove("actions")
        discrete_n = None if action_space is None else action_space.n
    elif action_space is not None:
        low, high = action_space.low, action_space.high
    return _Rules(tuple(floats), schema.discrete_actions, discrete_n, low, high, space_file)


@dataclass(frozen=True)
class _Stats:
    """What the scan accumulates statistics of, and of which episodes' rows."""

    columns: dict[str, StatsAccumulator]
    kept_episodes: pa.Array | None = None
    returns: ReturnsAccumulator | None = None

    @property
    def any(self) -> bool:
        return bool(self.columns) or self.returns is not None

    def results(self) -> dict[str, FeatureStats]:
        found = {column: running.result() for column, running in self.columns.items()}
        if self.returns is not None:
            found[RETURNS] = self.returns.result()
        return found


@dataclass(frozen=True)
class _FileScan:
    rows: int
    """Rows of the row groups checked."""
    outside: int
    first_outside: str
    """``PATH at eps_id ... t ...`` of the first row outside the box; ``""`` without one."""


def _check_file(
    filesystem: pafs.FileSystem,
    fact: FileFacts,
    groups: list[int],
    schema: EpisodeSchema,
    rules: _Rules,
    check: CheckValues,
    stats: _Stats | None = None,
) -> _FileScan:
    try:
        with filesystem.open_input_file(fact.path) as handle:
            footer = pq.ParquetFile(handle)
            found, outside = _scan(footer, groups, schema, rules, stats)
            rows = sum(footer.metadata.row_group(g).num_rows for g in groups)
            for column in _VALUE_COLUMNS:
                if found[column].rows:
                    _refuse(footer, fact, column, found[column], rows, schema, rules, check)
            first_outside = ""
            if outside.rows:
                first_outside = f"{fact.path} at {_row(footer, outside, schema)}"
    except (pa.ArrowInvalid, OSError) as exc:
        raise DatasetError(
            f"{fact.path}: columns {', '.join(_value_columns(rules))} cannot be read "
            f"({' '.join(str(exc).split())}); expected readable Parquet data behind a valid "
            "footer (is the file corrupted?)"
        ) from None
    return _FileScan(rows, outside.rows, first_outside)


def _scan(
    footer: pq.ParquetFile,
    groups: list[int],
    schema: EpisodeSchema,
    rules: _Rules,
    stats: _Stats | None = None,
) -> tuple[dict[str, _Found], _Found]:
    """Offending rows per column, and rows outside the box, in ``groups`` of one file;
    ``stats`` accumulate their columns' values on the way."""
    found = {column: _Found() for column in _VALUE_COLUMNS}
    outside = _Found()
    bounded = rules.low is not None or rules.high is not None
    actions_leaf = -1
    if rules.discrete:
        actions_leaf = leaf_index(footer, schema.column_map.get("actions", "actions"))
    for group in groups:
        columns = list(rules.floats)
        if rules.discrete:
            statistics = footer.metadata.row_group(group).column(actions_leaf).statistics
            if not _cleared(statistics, rules.discrete_n):
                columns.append("actions")
        on_disk = [schema.column_map.get(c, c) for c in columns]
        table = footer.read_row_group(group, columns=on_disk)
        kept = _kept_rows(footer, group, schema, stats)
        for column, values in zip(columns, table.columns, strict=True):
            flat, width = _flat(values)
            if stats is not None and column in stats.columns:
                rows = flat.reshape(-1, width)
                stats.columns[column].add(rows if kept is None else rows[kept])
            if stats is not None and stats.returns is not None and column == "rewards":
                _add_returns(footer, group, schema, flat, kept, stats.returns)
            if column == "actions" and rules.discrete:
                outside_space = flat < 0
                if rules.discrete_n is not None:
                    outside_space |= flat >= rules.discrete_n
                found[column].add(outside_space, group, flat)
                continue
            found[column].add(_non_finite_rows(flat, width), group)
            if column == "actions" and bounded:
                outside.add(_outside_rows(flat, width, rules), group)
    return found, outside


def _kept_rows(
    footer: pq.ParquetFile, group: int, schema: EpisodeSchema, stats: _Stats | None
) -> np.ndarray | None:
    """Which rows of a row group belong to the episodes kept (``None``: all of them)."""
    if stats is None or not stats.any or stats.kept_episodes is None:
        return None
    name = schema.column_map.get("eps_id", "eps_id")
    ids = footer.read_row_group(group, columns=[name]).column(0)
    return pc.is_in(ids, value_set=stats.kept_episodes).to_numpy(zero_copy_only=False)


def _add_returns(
    footer: pq.ParquetFile,
    group: int,
    schema: EpisodeSchema,
    rewards: np.ndarray,
    kept: np.ndarray | None,
    returns: ReturnsAccumulator,
) -> None:
    """The rows of a row group into ``returns``, each episode keyed by ``(module_id,
    eps_id)`` (agents of one recording may share episode ids)."""
    names = ["eps_id", "t", "terminateds", "truncateds"]
    names += ["module_id"] if schema.has_module_id else []
    table = footer.read_row_group(group, columns=[schema.column_map.get(c, c) for c in names])
    columns = dict(zip(names, (decoded(c.combine_chunks()) for c in table.columns), strict=True))
    episodes = columns["eps_id"].cast(pa.string())
    if schema.has_module_id:
        episodes = pc.binary_join_element_wise(columns["module_id"], episodes, "\x1f")
    ends = pc.or_(columns["terminateds"], columns["truncateds"])
    found = [
        episodes.to_numpy(zero_copy_only=False),
        columns["t"].to_numpy(),
        rewards.astype(np.float64),
        ends.to_numpy(zero_copy_only=False),
    ]
    returns.add(*(values if kept is None else values[kept] for values in found))


def _value_columns(rules: _Rules) -> list[str]:
    discrete = ("actions",) if rules.discrete else ()
    return [c for c in _VALUE_COLUMNS if c in rules.floats or c in discrete]


def _cleared(stats: pq.Statistics | None, n: int | None) -> bool:
    """Whether an int64 column chunk's statistics prove every value lies in ``[0, n)``
    (``>= 0`` when ``n`` is None)."""
    if stats is None or not stats.has_min_max:
        return False
    return stats.min >= 0 and (n is None or stats.max < n)


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, int]:
    """A number or tensor column as one flat numpy array, and its values per row."""
    parts, width = [], 1
    for chunk in column.chunks:
        values, width = _chunk_values(chunk)
        parts.append(values)
    flat = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return flat, width


def _all_in_range(column: pa.ChunkedArray, n: int | None) -> bool:
    """Whether every value of an integer column lies in ``[0, n)`` (``>= 0`` when ``n`` is
    None)."""
    extremes = pc.min_max(column)
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    return low is None or (low >= 0 and (n is None or high < n))


def _all_finite(column: pa.ChunkedArray) -> bool:
    """Whether every value of a float number or tensor column is finite, chunk by chunk
    (no copy of the column)."""
    return all(np.isfinite(_chunk_values(chunk)[0]).all() for chunk in column.chunks)


def _chunk_values(chunk: pa.Array) -> tuple[np.ndarray, int]:
    """One chunk of a number or tensor column as a flat numpy array (a view where the
    chunk has no nulls, as validated data has none), and its values per row."""
    width = 1
    if isinstance(chunk, pa.ExtensionArray):
        chunk = chunk.storage
    if pa.types.is_fixed_size_list(chunk.type):
        width = chunk.type.list_size
        chunk = chunk.values.slice(chunk.offset * width, len(chunk) * width)
    return chunk.to_numpy(zero_copy_only=False), width


def _non_finite_rows(flat: np.ndarray, width: int) -> np.ndarray:
    finite = np.isfinite(flat)
    if finite.all():
        return np.zeros(0, bool)
    return ~finite.reshape(-1, width).all(axis=1)


def _outside_rows(flat: np.ndarray, width: int, rules: _Rules) -> np.ndarray:
    """Rows with a component below ``low`` or above ``high`` (NaN compares as inside)."""
    outside = np.zeros(len(flat), bool)
    if rules.low is not None:
        outside |= flat < rules.low
    if rules.high is not None:
        outside |= flat > rules.high
    return outside.reshape(-1, width).any(axis=1)


def _refuse(
    footer: pq.ParquetFile,
    fact: FileFacts,
    column: str,
    found: _Found,
    rows: int,
    schema: EpisodeSchema,
    rules: _Rules,
    check: CheckValues,
) -> None:
    label = column_label(column, schema.column_map)
    of = _of_rows(rows, fact.num_rows, check)
    first = _row(footer, found, schema)
    if column == "actions" and rules.discrete and rules.discrete_n is None:
        raise DatasetError(
            f"{fact.path}: column {label} has negative actions in {found.rows} of {of}, first "
            f"at {first} (action {found.value}); expected discrete actions to be indices "
            f">= 0 (int64 actions are discrete; no action_space in {rules.space_file}). "
            "Fix: correct the actions, or store continuous ones as float32 tensors"
        )
    if column == "actions" and rules.discrete:
        n = rules.discrete_n
        raise DatasetError(
            f"{fact.path}: column {label} has actions outside [0, {n}) in {found.rows} of "
            f"{of}, first at {first} (action {found.value}); expected 0 <= action < {n} as "
            f"the discrete action_space (n: {n}) in {rules.space_file} declares. Fix: correct "
            "the actions or action_space.n"
        )
    raise DatasetError(
        f"{fact.path}: column {label} has non-finite values (NaN or inf) in {found.rows} of "
        f"{of}, first at {first}; expected finite numbers in every row. Fix: drop the "
        "episodes holding them or repair the values where they were recorded"
    )


def _row(footer: pq.ParquetFile, found: _Found, schema: EpisodeSchema) -> str:
    """``eps_id 'e1' t 3`` (after ``module_id 'm0'`` when the dataset has that column)."""
    names = ["eps_id", "t"] + (["module_id"] if schema.has_module_id else [])
    on_disk = [schema.column_map.get(c, c) for c in names]
    ids = footer.read_row_group(found.group, columns=on_disk).slice(found.position, 1)
    eps_id, t, *module = (ids.column(name)[0].as_py() for name in on_disk)
    where = f"eps_id {eps_id!r} t {t}"
    return f"module_id {module[0]!r} {where}" if module else where


def _of_rows(checked: int, total: int, check: CheckValues) -> str:
    return f"{checked} rows" if check == "full" else f"the {checked} rows sampled of {total}"
