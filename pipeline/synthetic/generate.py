"""Write a task family's train and held-out splits as canonical episode datasets.

Output: ``OUT/train/`` and ``OUT/heldout/``, each a dataset of its own with
``part-NNNNN.parquet`` files (rows sorted by task, row groups of ``ROW_GROUP_SIZE``,
observations and float actions as ``fixed_shape_tensor``, images as uint8 ones) and a
``dataset.json`` naming every task's parameters and the arguments that rebuild it. Same
arguments and seed, same bytes: nothing time- or machine-dependent is written.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.contract.dataset_json import DatasetMetadata, GeneratorInfo, Space, write_metadata
from pipeline.synthetic.point_robot_episodes import BEHAVIOR_COLUMN

ROW_GROUP_SIZE = 65_536
ROWS_PER_FILE = 1_048_576
SPLITS = ("train", "heldout")
_TENSOR_COLUMNS = ("obs", "new_obs", "actions")
_COLUMN_ORDER = (
    "eps_id",
    "t",
    "obs",
    "actions",
    "rewards",
    "terminateds",
    "truncateds",
    "new_obs",
    BEHAVIOR_COLUMN,
)


class TaskFamily(Protocol):
    """A distribution of tasks and the rows each task produces."""

    name: ClassVar[str]
    description: ClassVar[str]
    default_tasks: ClassVar[int]
    default_heldout_tasks: ClassVar[int]

    @property
    def rows_per_task(self) -> int: ...

    def spaces(self) -> tuple[Space, Space]: ...

    def sample_tasks(self, rng: np.random.Generator, n: int) -> list[dict[str, Any]]: ...

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]: ...


def generate(
    family: TaskFamily,
    out: str | Path,
    *,
    tasks: int | None = None,
    heldout_tasks: int | None = None,
    seed: int = 0,
    rows_per_file: int = ROWS_PER_FILE,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write ``OUT/train`` and ``OUT/heldout``; returns their directories by split.

    Train and held-out tasks come from independent streams of one seed, so the held-out
    set does not change when the number of train tasks does. Refuses (``ValueError``,
    nothing written) an output split directory that already holds files.
    """
    counts = {
        "train": family.default_tasks if tasks is None else tasks,
        "heldout": family.default_heldout_tasks if heldout_tasks is None else heldout_tasks,
    }
    for split, count in counts.items():
        if count < 1:
            raise ValueError(f"{split} tasks must be at least 1, got {count}")
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file must be at least 1, got {rows_per_file}")
    out = Path(out)
    refuse_written_splits(out)
    arguments = {
        **asdict(family),  # type: ignore[call-overload]
        "tasks": counts["train"],
        "heldout_tasks": counts["heldout"],
        "seed": seed,
        "rows_per_file": rows_per_file,
    }
    streams = dict(zip(SPLITS, np.random.SeedSequence(seed).spawn(len(SPLITS)), strict=True))
    written = {}
    for split in SPLITS:
        rng = np.random.default_rng(streams[split])
        written[split] = _write_split(
            family, out / split, split, counts[split], rng, arguments, rows_per_file, progress
        )
    return written


def refuse_written_splits(out: Path) -> None:
    """``ValueError`` (nothing written) when a split directory under ``out`` holds files."""
    for split in SPLITS:
        directory = out / split
        if directory.exists() and any(directory.iterdir()):
            raise ValueError(
                f"{directory} already holds files; expected a new or empty directory "
                "(delete it to regenerate)"
            )


def _write_split(
    family: TaskFamily,
    directory: Path,
    split: str,
    n_tasks: int,
    rng: np.random.Generator,
    arguments: dict[str, Any],
    rows_per_file: int,
    progress: Callable[[str], None] | None,
) -> Path:
    params = family.sample_tasks(rng, n_tasks)
    return write_tasks(family, directory, split, params, rng, arguments, rows_per_file, progress)


def write_tasks(
    family: TaskFamily,
    directory: Path,
    split: str,
    params: list[dict[str, Any]],
    rng: np.random.Generator,
    arguments: dict[str, Any],
    rows_per_file: int = ROWS_PER_FILE,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Write one split of ``family`` for tasks already chosen (``params``, one per task,
    recorded in ``dataset.json``); ``arguments`` are the generator's, as recorded there.

    Columns ``family.episodes`` returns beyond the canonical ones pass through after them.
    """
    directory.mkdir(parents=True, exist_ok=True)
    n_tasks = len(params)
    width = max(5, len(str(n_tasks - 1)))
    task_ids = [f"{split}-{i:0{width}d}" for i in range(n_tasks)]
    tasks_per_file = max(1, rows_per_file // family.rows_per_task)
    n_files = math.ceil(n_tasks / tasks_per_file)
    files, num_rows = [], 0
    for index, start in enumerate(range(0, n_tasks, tasks_per_file)):
        end = min(start + tasks_per_file, n_tasks)
        columns = family.episodes(rng, params[start:end], task_ids[start:end], start)
        table = _canonical_table(columns, task_ids[start:end], family.rows_per_task)
        name = f"part-{index:05d}.parquet"
        pq.write_table(table, directory / name, row_group_size=ROW_GROUP_SIZE, compression="zstd")
        files.append(name)
        num_rows += table.num_rows
        if progress is not None:
            progress(
                f"{family.name} {split}: wrote {name} ({index + 1}/{n_files} files, "
                f"{end}/{n_tasks} tasks, {num_rows} rows)"
            )
    observation_space, action_space = family.spaces()
    metadata = DatasetMetadata(
        id=family.name,
        split=split,  # type: ignore[arg-type]
        description=family.description,
        observation_space=observation_space,
        # Image families say the axis order of their uint8 observations.
        observation_layout=getattr(family, "observation_layout", None),
        action_space=action_space,
        tasks=dict(zip(task_ids, params, strict=True)),
        generator=GeneratorInfo(name=family.name, args=arguments),
        num_rows=num_rows,
        files=files,
    )
    write_metadata(directory, metadata)
    return directory


def _canonical_table(
    columns: dict[str, np.ndarray], task_ids: list[str], rows_per_task: int
) -> pa.Table:
    arrays: dict[str, pa.Array] = {}
    extra = [name for name in columns if name not in _COLUMN_ORDER]
    for name in [*(n for n in _COLUMN_ORDER if n in columns), *extra]:
        values = columns[name]
        if name in _TENSOR_COLUMNS and values.dtype in (np.float32, np.uint8):
            arrays[name] = pa.FixedShapeTensorArray.from_numpy_ndarray(np.ascontiguousarray(values))
        elif name == "eps_id" and values.dtype == object:
            arrays[name] = pa.array(values, type=pa.string())
        elif values.dtype.kind in "OU":
            arrays[name] = pa.array(values.astype(object), type=pa.string()).dictionary_encode()
        else:
            arrays[name] = pa.array(values)
    indices = np.repeat(np.arange(len(task_ids), dtype=np.int32), rows_per_task)
    arrays["task_id"] = pa.DictionaryArray.from_arrays(indices, pa.array(task_ids, pa.string()))
    return pa.table(arrays)
