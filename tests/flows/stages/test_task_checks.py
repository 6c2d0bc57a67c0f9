"""What task sampling and evaluation would refuse is refused by ``inspect_datasets``, without
Ray, in the config's words: tasks smaller than K + Q, too few samples for a meta-batch,
held-out tasks without the parameters their rollouts need, unsorted data and tasks larger
than a window when the task samples stream."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from flows.stages.datasets import inspect_datasets
from pipeline.contract.schema import DatasetError
from tests.helpers.flow_runs import tiny_config, tiny_point_robot
from tests.helpers.fresh_python import fresh_python

PART = "part-00000.parquet"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 train tasks and 4 held-out tasks of 20 transitions each."""
    return tiny_point_robot(tmp_path_factory.mktemp("point_robot"))


def _rewritten(split: Path, out: Path, change: Callable[[pa.Table], pa.Table]) -> Path:
    """``split``'s rows changed by ``change``, written to ``out`` without ``dataset.json``
    (whose row counts would no longer hold)."""
    out.mkdir(parents=True)
    pq.write_table(change(pq.read_table(split / PART)), out / PART)
    return out


def _shortened(tasks: dict[str, int]) -> Callable[[pa.Table], pa.Table]:
    """Keep only the first ``tasks[task]`` steps of each named task's episode."""

    def change(table: pa.Table) -> pa.Table:
        task = pc.cast(table.column("task_id"), pa.string())
        keep = pa.array([True] * table.num_rows)
        for name, steps in tasks.items():
            cut = pc.and_(pc.equal(task, name), pc.greater_equal(table.column("t"), steps))
            keep = pc.and_(keep, pc.invert(cut))
        return table.filter(keep)

    return change


def test_tasks_smaller_than_support_plus_query_are_refused_in_config_words(
    data: Path, tmp_path: Path
) -> None:
    train = _rewritten(
        data / "train", tmp_path / "train", _shortened({"train-00003": 7, "train-00008": 9})
    )
    cfg = tiny_config(data, tmp_path, [f"data.train={train}"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"train dataset {train}: 2 of 12 tasks have fewer than tasks.support + tasks.query = "
        "5 + 5 = 10 transitions: 'train-00003' (7), 'train-00008' (9); expected at least that "
        "many per task. Lower tasks.support or tasks.query, remove those tasks from the "
        "dataset, or set tasks.skip_small_tasks to true to leave them out"
    )
    skipping = tiny_config(data, tmp_path, [f"data.train={train}", "tasks.skip_small_tasks=true"])
    inspect_datasets(skipping)


def test_support_larger_than_every_task_is_refused_even_when_skipping_small_tasks(
    data: Path, tmp_path: Path
) -> None:
    cfg = tiny_config(data, tmp_path, ["tasks.support=16", "tasks.skip_small_tasks=true"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"train dataset {data / 'train'}: every one of its 12 tasks has fewer than "
        "tasks.support + tasks.query = 16 + 5 = 21 transitions (largest: 20); lower "
        "tasks.support or tasks.query"
    )


def test_small_held_out_tasks_are_refused_before_training(data: Path, tmp_path: Path) -> None:
    heldout = _rewritten(data / "heldout", tmp_path / "heldout", _shortened({"heldout-00001": 3}))
    cfg = tiny_config(data, tmp_path, [f"data.heldout={heldout}", "evaluation.rollout_episodes=0"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"held-out dataset {heldout}: 1 of 4 tasks have fewer than tasks.support + "
        "tasks.query = 5 + 5 = 10 transitions: 'heldout-00001' (3); expected at least that "
        "many per task. Lower tasks.support or tasks.query, remove those tasks from the "
        "dataset, or set tasks.skip_small_tasks to true to leave them out"
    )


def test_too_few_samples_for_one_meta_batch_per_learner_are_refused(
    data: Path, tmp_path: Path
) -> None:
    # 12 tasks of 20 transitions: 2 samples of 5 + 5 each, 24 in all.
    inspect_datasets(tiny_config(data, tmp_path, ["tasks.meta_batch=24"]))
    cfg = tiny_config(data, tmp_path, ["tasks.meta_batch=25"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"train dataset {data / 'train'}: its tasks give 24 samples of tasks.support + "
        "tasks.query = 10 transitions per epoch, fewer than one meta-batch of "
        "tasks.meta_batch = 25 samples; lower tasks.meta_batch, tasks.support or tasks.query, "
        "or add tasks"
    )
    cfg = tiny_config(data, tmp_path, ["tasks.meta_batch=8", "learners.num_learners=4"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"train dataset {data / 'train'}: its tasks give 24 samples of tasks.support + "
        "tasks.query = 10 transitions per epoch, fewer than one meta-batch of "
        "tasks.meta_batch = 8 samples for each of 4 learners (learners.num_learners); lower "
        "tasks.meta_batch, tasks.support or tasks.query, or add tasks"
    )


def test_rollouts_of_held_out_tasks_without_parameters_are_refused(
    data: Path, tmp_path: Path
) -> None:
    heldout = tmp_path / "heldout"
    shutil.copytree(data / "heldout", heldout)
    metadata = json.loads((heldout / "dataset.json").read_text())
    del metadata["tasks"]
    (heldout / "dataset.json").write_text(json.dumps(metadata))
    cfg = tiny_config(data, tmp_path, [f"data.heldout={heldout}"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"held-out dataset {heldout}: dataset.json describes no task parameters ('tasks'); "
        "point_robot rollouts need each task's parameters (name the columns that hold them in "
        "evaluation.task_params_columns, or set evaluation.rollout_episodes to 0)"
    )
    inspect_datasets(
        tiny_config(data, tmp_path, [f"data.heldout={heldout}", "evaluation.rollout_episodes=0"])
    )


def test_streamed_task_samples_need_data_sorted_by_task(data: Path, tmp_path: Path) -> None:
    def reversed_tasks(table: pa.Table) -> pa.Table:
        order = pc.sort_indices(
            pa.table({"task": pc.cast(table.column("task_id"), pa.string()), "t": table["t"]}),
            sort_keys=[("task", "descending"), ("t", "ascending")],
        )
        return table.take(order)

    train = _rewritten(data / "train", tmp_path / "train", reversed_tasks)
    inspect_datasets(tiny_config(data, tmp_path, [f"data.train={train}", "tasks.mode=memory"]))
    cfg = tiny_config(data, tmp_path, [f"data.train={train}", "tasks.mode=stream"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"{train / PART}: column 'task_id' is not sorted by task: row group 0 holds task "
        f"'train-00010' after task 'train-00011' (row group 0 of {train / PART}); streaming "
        "task samples reads whole tasks in windows and needs the rows sorted by (task_id, "
        f"eps_id, t). Rewrite the dataset with `offmeta data compact {train} --out DIR`, or "
        "read it in memory (tasks.mode: memory)"
    )


def test_a_task_larger_than_a_streamed_window_is_refused(data: Path, tmp_path: Path) -> None:
    # 240 rows of 54 bytes take more than 0.001 MB: auto mode streams them.
    cfg = tiny_config(data, tmp_path, ["tasks.mode=auto", "tasks.memory_budget_mb=0.001"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        "task_samples: task 'train-00000' has 20 transitions, more than a window of 4 rows, "
        "the most that memory_budget_mb=0.001 allows at 54 bytes per row (4 copies of a "
        "window fit in the budget); raise memory_budget_mb to at least 0.005, or split the "
        "task"
    )
    inspect_datasets(
        tiny_config(data, tmp_path, ["tasks.mode=auto", "tasks.memory_budget_mb=0.005"])
    )


def test_held_out_evaluation_of_several_modules_is_refused_before_training(
    data: Path, tmp_path: Path
) -> None:
    def two_modules(table: pa.Table) -> pa.Table:
        copies = [
            table.append_column("module_id", pa.array([module] * table.num_rows))
            for module in ("default_policy", "helper")
        ]
        return pa.concat_tables(copies)

    train = _rewritten(data / "train", tmp_path / "train", two_modules)
    heldout = _rewritten(data / "heldout", tmp_path / "heldout", two_modules)
    module = "{obs_dim: 2, action_dim: 2, model: {hidden_sizes: [8]}}"
    paths = [f"data.train={train}", f"data.heldout={heldout}"]
    cfg = tiny_config(data, tmp_path, [*paths, f"learners.modules.helper={module}"])
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        "held-out evaluation supports one module per dataset for now, but learners.modules "
        "trains on the rows of modules ['default_policy', 'helper']; expected one "
        "(learners.modules_to_update names the modules to train)"
    )
    helper = f"learners.modules.helper={module}"
    one = tiny_config(
        data, tmp_path, [*paths, helper, "learners.modules_to_update=[default_policy]"]
    )
    inspect_datasets(one)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", ["auto", "stream"])
def test_the_checks_import_no_torch(mode: str) -> None:
    # `offmeta run` checks the data before it starts Ray, and importing torch takes seconds.
    probe = (
        "import sys\nfrom flows.config import load_config\n"
        "from flows.stages.datasets import inspect_datasets\n"
        f"inspect_datasets(load_config('flows/configs/point_robot.yaml', ['tasks.mode={mode}']))\n"
        "print('torch' in sys.modules)"
    )
    assert fresh_python(probe) == "False"
