"""Task samples: K support + Q query transitions per task, disjoint, in meta-batches.

Every row's ``rewards`` is its global row index and ``TASK_OF[row]`` its task, so each
sample can be traced back to the transitions it used. Tasks are interleaved across
files: nothing relies on rows being sorted by task on disk.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pipeline.contract.schema import DEFAULT_MODULE_ID, DatasetError
from pipeline.reads.episodes import inspect_episodes, read_episodes
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.options import TaskStream
from pipeline.tasks.samples import read_task_samples, task_samples
from tests.helpers.episode_files import episode_table, write

SIZES = {"t0": 30, "t1": 24, "t2": 40, "t3": 20, "t4": 26, "t5": 33}
K, Q = 4, 6
SAMPLES = sum(n // (K + Q) for n in SIZES.values())  # 3 + 2 + 4 + 2 + 2 + 3 = 16
TASK_OF = np.repeat(list(SIZES), list(SIZES.values()))


def _write_tasks(directory, sizes, *, files=2, modules=None, seed=0) -> None:
    """Episodes of 5 rows per task, episodes dealt to the files in a shuffled order."""
    task_of = np.repeat(list(sizes), list(sizes.values()))
    ids = np.arange(len(task_of))
    episode = np.concatenate([np.arange(n) // 5 + 100 * i for i, n in enumerate(sizes.values())])
    step = np.concatenate([np.arange(n) % 5 for n in sizes.values()])
    dealt = np.random.default_rng(seed).permutation(np.unique(episode)) % files
    for part in range(files):
        rows = ids[np.isin(episode, np.unique(episode)[dealt == part])]
        extra = {}
        if modules is not None:
            extra["module_id"] = pa.array([modules[t] for t in task_of[rows]]).dictionary_encode()
        table = episode_table(
            len(rows),
            action_dim=None,
            eps_id=pa.array(episode[rows], pa.int64()),
            t=pa.array(step[rows], pa.int32()),
            rewards=pa.array(rows.astype(np.float32)),
            task_id=pa.array(task_of[rows]).dictionary_encode(),
            terminateds=pa.array(np.zeros(len(rows), bool)),
            **extra,
        )
        write(directory / f"part-{part}.parquet", table)


@pytest.fixture(scope="module")
def episodes(tmp_path_factory, ray_session):
    directory = tmp_path_factory.mktemp("tasks")
    _write_tasks(directory, SIZES)
    return read_episodes(directory)


@pytest.fixture(scope="module")
def samples(episodes):
    return task_samples(episodes, support=K, query=Q)


def _ids(meta, part, module=DEFAULT_MODULE_ID) -> np.ndarray:
    return meta[part][module]["rewards"].numpy().astype(int)


@pytest.mark.timeout(60)
def test_meta_batches_are_shaped_disjoint_and_cover_each_task_once(samples):
    [stream] = split_for_learners(samples, 1, minibatch_size=4, seed=0)
    with stream:
        epoch = list(stream.take(SAMPLES // 4))
        following = list(stream.take(SAMPLES // 4))

    meta = epoch[0]
    support, query = meta["support"][DEFAULT_MODULE_ID], meta["query"][DEFAULT_MODULE_ID]
    assert support["obs"].shape == (4, K, 3) and query["obs"].shape == (4, Q, 3)
    assert support["rewards"].shape == (4, K) and query["actions"].shape == (4, Q)
    used = []
    for meta in epoch:
        support_ids, query_ids = _ids(meta, "support"), _ids(meta, "query")
        for task in range(4):
            sample = np.concatenate([support_ids[task], query_ids[task]])
            assert len(set(TASK_OF[sample])) == 1
        used.append(np.concatenate([support_ids.ravel(), query_ids.ravel()]))
    used = np.concatenate(used)
    assert len(used) == SAMPLES * (K + Q) and len(np.unique(used)) == len(used)
    assert not np.array_equal(used, np.concatenate([_ids(m, "support").ravel() for m in following]))
    assert samples.summary() == {
        "mode": "memory",
        "support": K,
        "query": Q,
        "tasks": 6,
        "modules": [DEFAULT_MODULE_ID],
        "rows": 173,
        "samples_per_epoch": 16,
        "unused_rows_per_epoch": 13,
        "skipped_tasks": 0,
    }


@pytest.mark.timeout(60)
def test_two_learners_with_half_the_tasks_see_what_one_learner_sees(samples):
    pair = split_for_learners(samples, 2, minibatch_size=2, seed=7)
    [single] = split_for_learners(samples, 1, minibatch_size=4, seed=7)
    [late] = split_for_learners(TaskStream(samples, ranks=[1]), 2, minibatch_size=2, seed=7)
    with pair[0], pair[1], single, late:
        steps = 6  # crosses into the second epoch
        halves = [list(stream.take(steps)) for stream in pair]
        whole = list(single.take(steps))
        only_second = list(late.take(steps))

    for step in range(steps):
        for part in ("support", "query"):
            joined = np.concatenate([_ids(halves[r][step], part) for r in (0, 1)])
            np.testing.assert_array_equal(joined, _ids(whole[step], part))
            np.testing.assert_array_equal(
                _ids(only_second[step], part), _ids(halves[1][step], part)
            )
    assert late.name == "learner-1"


@pytest.mark.timeout(60)
def test_task_streams_resume_exactly(samples):
    [original] = split_for_learners(samples, 1, minibatch_size=3, seed=1)
    with original:
        list(original.take(7))
        saved = original.state()
        expected = [_ids(m, "query") for m in original.take(4)]
    [resumed] = split_for_learners(samples, 1, minibatch_size=3, seed=1)
    with resumed:
        resumed.restore(saved)
        got = [_ids(m, "query") for m in resumed.take(4)]

    # 16 samples give 5 meta-batches of 3 per epoch: batch 7 is the second of epoch 1.
    assert (saved["epoch"], saved["batches_consumed"], saved["exact"]) == (1, 2, True)
    assert all(np.array_equal(a, b) for a, b in zip(expected, got, strict=True))


def test_the_samples_do_not_depend_on_file_order(tmp_path, samples, ray_session):
    _write_tasks(tmp_path, SIZES, files=3, seed=11)
    reordered = task_samples(read_episodes(tmp_path), support=K, query=Q)

    # Row ids (rewards) in memory order, and the transitions each sample uses.
    np.testing.assert_array_equal(reordered.arrays["rewards"], samples.arrays["rewards"])
    np.testing.assert_array_equal(
        reordered.arrays["rewards"][reordered.epoch_plan(5)[0]],
        samples.arrays["rewards"][samples.epoch_plan(5)[0]],
    )


def test_small_tasks_are_listed_or_skipped_and_counted(tmp_path, ray_session):
    _write_tasks(tmp_path, {"big": 25, "tiny": 5, "short": 9, "fine": 10})
    episodes = read_episodes(tmp_path)

    with pytest.raises(DatasetError) as caught:
        task_samples(episodes, support=K, query=Q)
    assert str(caught.value) == (
        "task_samples: 2 of 4 tasks have fewer than support + query = 4 + 6 = 10 "
        "transitions: 'short' (9), 'tiny' (5); expected at least that many per task. Lower "
        "support or query, remove those tasks from the dataset, or pass "
        "skip_small_tasks=True to leave them out (they are counted in "
        "TaskSamples.skipped_tasks)"
    )
    skipped = task_samples(episodes, support=K, query=Q, skip_small_tasks=True)
    assert skipped.skipped_tasks == {"short": 9, "tiny": 5}
    assert skipped.task_ids == ("big", "fine")
    rows, _ = skipped.epoch_plan(0)
    task_of = np.repeat(["big", "tiny", "short", "fine"], [25, 5, 9, 10])
    used = skipped.arrays["rewards"][rows].astype(int)
    assert set(task_of[used.ravel()]) == {"big", "fine"} and rows.shape == (3, K + Q)


@pytest.mark.timeout(60)
def test_an_epoch_without_one_meta_batch_is_an_error_naming_the_learner(samples):
    [stream] = split_for_learners(samples, 1, minibatch_size=20)
    with stream, pytest.raises(DatasetError) as caught:
        next(stream.take(1))
    assert str(caught.value) == (
        "learner-0: epoch 0 has 16 task samples of 4 support + 6 query transitions, fewer "
        "than one meta-batch of 20 tasks for each of 1 learner(s); lower minibatch_size, "
        "support or query, or add tasks"
    )


@pytest.mark.timeout(60)
def test_samples_of_several_modules_are_grouped_per_module(tmp_path, ray_session):
    modules = {"t0": "walker", "t1": "walker", "t2": "runner", "t3": "runner"}
    sizes = {task: 20 for task in modules}
    _write_tasks(tmp_path, sizes, modules=modules)
    samples = task_samples(read_episodes(tmp_path), support=K, query=Q)
    [stream] = split_for_learners(samples, 1, minibatch_size=4, seed=3)
    with stream:
        metas = list(stream.take(2))

    task_of = np.repeat(list(sizes), 20)
    for meta in metas:
        counts = {m: meta["support"][m]["obs"].shape[0] for m in meta["support"]}
        assert sum(counts.values()) == 4
        for module, group in meta["query"].items():
            assert group["obs"].shape == (counts[module], Q, 3)
            tasks = task_of[group["rewards"].numpy().astype(int).ravel()]
            assert {modules[t] for t in tasks} == {module}
    assert samples.module_ids == ("runner", "walker")


def test_task_sample_arguments_are_checked(episodes, samples):
    with pytest.raises(ValueError, match=r"support must be an int >= 1, got 0"):
        task_samples(episodes, support=0, query=Q)
    with pytest.raises(ValueError, match=r"columns \['task_id'\] group the rows"):
        task_samples(episodes, support=K, query=Q, columns=["obs", "task_id"])
    # Task samples choose their columns in task_samples: a RowStream does not take them.
    with pytest.raises(TypeError) as refused:
        RowStream(samples, columns=["obs"])
    assert str(refused.value) == (
        "RowStream streams the rows of Episodes (read_episodes) or of a Ray DataIterator "
        "(one learner's shard), got TaskSamples; pass task samples to split_for_learners "
        "as they are (or in a TaskStream)"
    )
    with pytest.raises(TypeError) as refused:
        TaskStream(episodes, ranks=[0])
    assert str(refused.value) == (
        "TaskStream streams the result of task_samples (TaskSamples or TaskWindows), got "
        "Episodes; pass Episodes to split_for_learners as they are (or in a RowStream)"
    )
    with pytest.raises(ValueError, match=r"ranks must be distinct learners in \[0, 2\), got \[2\]"):
        split_for_learners(TaskStream(samples, ranks=[2]), 2, minibatch_size=2)


def test_one_sample_per_task_is_disjoint_in_task_order_and_seeded(samples):
    meta, task_ids = samples.one_per_task(4, seed=3)
    assert task_ids == sorted(task_ids) and len(set(task_ids)) == 4
    support, query = _ids(meta, "support"), _ids(meta, "query")
    assert support.shape == (4, K) and query.shape == (4, Q)
    for i, task in enumerate(task_ids):
        rows = np.concatenate([support[i], query[i]])
        assert len(set(rows)) == K + Q and set(TASK_OF[rows]) == {task}
    again, same_ids = samples.one_per_task(4, seed=3)
    assert same_ids == task_ids and np.array_equal(_ids(again, "query"), query)
    _, every = samples.one_per_task(100, seed=0)
    assert every == sorted(SIZES)


@pytest.mark.parametrize("modules_to_update", [None, ["walker"]], ids=["all-modules", "one-module"])
def test_samples_read_in_this_process_equal_those_read_through_ray(
    tmp_path, ray_session, modules_to_update
):
    modules = {"t0": "walker", "t1": "runner", "t2": "walker", "t3": "runner", "t4": "walker"}
    _write_tasks(tmp_path, {task: SIZES[task] for task in modules}, files=3, modules=modules)
    options = {"support": K, "query": Q, "modules_to_update": modules_to_update, "gamma": 0.9}
    through_ray = task_samples(read_episodes(tmp_path), **options)
    here = read_task_samples(inspect_episodes(tmp_path), **options)

    assert here.summary() == through_ray.summary()
    assert (here.task_ids, here.module_ids, here.columns) == (
        through_ray.task_ids,
        through_ray.module_ids,
        through_ray.columns,
    )
    for name, array in through_ray.arrays.items():
        np.testing.assert_array_equal(here.arrays[name], array, err_msg=name)
    np.testing.assert_array_equal(here.group_offsets, through_ray.group_offsets)
    np.testing.assert_array_equal(here.group_modules, through_ray.group_modules)
    for seed in (0, 1):
        rows, modules = here.epoch_plan(seed)
        expected_rows, expected_modules = through_ray.epoch_plan(seed)
        np.testing.assert_array_equal(rows, expected_rows)
        np.testing.assert_array_equal(modules, expected_modules)


def test_samples_read_in_this_process_stream_as_planned(tmp_path):
    _write_tasks(tmp_path, SIZES, files=1)  # one file: sorted by task, as streaming needs
    options = {"support": K, "query": Q, "mode": "stream", "memory_budget_mb": 1}
    here = read_task_samples(inspect_episodes(tmp_path), **options)
    assert here.summary() == task_samples(inspect_episodes(tmp_path), **options).summary()
