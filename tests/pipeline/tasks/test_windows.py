"""Task samples read in windows of whole tasks (``task_samples(mode="stream")``).

Rows are written sorted by (task, episode, t), as ``offmeta data compact`` writes them,
into three files of 16-row row groups, so that row groups hold several tasks and tasks
span row groups and files. Every row's ``rewards`` is its global row index and
``TASK_OF[row]`` its task, so each sample can be traced back to the transitions it used.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from flows.stages.train import train
from pipeline.contract.schema import DEFAULT_MODULE_ID, DatasetError
from pipeline.reads.episodes import inspect_episodes, read_episodes
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.feed import TaskWindowFeed
from pipeline.tasks.grouping import TaskSamples
from pipeline.tasks.samples import task_samples
from pipeline.tasks.windows import TaskWindows
from tests.helpers.episode_files import episode_table
from tests.helpers.flow_runs import tiny_config, tiny_point_robot

SIZES = {f"t{i:02d}": 20 + (7 * i) % 31 for i in range(24)}  # 831 rows
K, Q = 4, 6
SAMPLES = sum(n // (K + Q) for n in SIZES.values())  # 72
TASK_OF = np.repeat(list(SIZES), list(SIZES.values()))
BUDGET_MB = 0.03  # windows of at most 187 rows at 42 bytes per row: 5 windows


def _write_sorted(directory, sizes, *, files=3, row_group_size=16, modules=None) -> None:
    """Episodes of 5 rows, sorted by (task, episode, t), cut into ``files`` files."""
    task_of = np.repeat(list(sizes), list(sizes.values()))
    episode = np.concatenate([np.arange(n) // 5 + 100 * i for i, n in enumerate(sizes.values())])
    step = np.concatenate([np.arange(n) % 5 for n in sizes.values()])
    for part, rows in enumerate(np.array_split(np.arange(len(task_of)), files)):
        extra = {}
        if modules is not None:
            extra["module_id"] = pa.array([modules[e % 2] for e in episode[rows]])
        table = episode_table(
            len(rows),
            action_dim=None,
            seed=part,
            eps_id=pa.array(episode[rows], pa.int64()),
            t=pa.array(step[rows], pa.int32()),
            rewards=pa.array(rows.astype(np.float32)),
            task_id=pa.array(task_of[rows]).dictionary_encode(),
            terminateds=pa.array(np.zeros(len(rows), bool)),
            **extra,
        )
        directory.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=row_group_size)


@pytest.fixture(scope="module")
def sorted_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sorted")
    _write_sorted(directory, SIZES)
    return directory


@pytest.fixture(scope="module")
def windows(sorted_dir) -> TaskWindows:
    return task_samples(
        inspect_episodes(sorted_dir), support=K, query=Q, mode="stream", memory_budget_mb=BUDGET_MB
    )


def _ids(meta, part, module=DEFAULT_MODULE_ID) -> np.ndarray:
    return meta[part][module]["rewards"].numpy().astype(int)


def _take(samples, count, *, minibatch_size, seed=0, state=None, learners=1):
    streams = split_for_learners(samples, learners, minibatch_size=minibatch_size, seed=seed)
    try:
        if state is not None:
            for stream, saved in zip(streams, state, strict=True):
                stream.restore(saved)
        taken: list[list] = [[] for _ in streams]
        for _ in range(count):  # in step, as learners take: each deal holds a pool's batches
            for stream, batches in zip(streams, taken, strict=True):
                batches.extend(stream.take(1))
        return taken, [stream.state() for stream in streams], [s.stats() for s in streams]
    finally:
        for stream in streams:
            stream.close()


def _assert_equal_batches(got, expected) -> None:
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        assert a.keys() == b.keys()
        for part in a:
            assert a[part].keys() == b[part].keys()
            for module in a[part]:
                for name, tensor in a[part][module].items():
                    other = b[part][module][name]
                    assert tensor.dtype == other.dtype and torch.equal(tensor, other), name


def test_windows_are_whole_sorted_tasks_within_the_row_limit(windows):
    assert isinstance(windows, TaskWindows) and windows.window_rows == 187
    assert len(windows.windows) == 5
    in_order = [task for window in windows.windows for task in window.task_ids]
    assert in_order == list(SIZES)
    for window in windows.windows:
        assert window.rows == sum(SIZES[t] for t in window.task_ids) <= windows.window_rows
    assert windows.samples_per_epoch == SAMPLES
    assert windows.summary() == {
        "mode": "stream",
        "support": K,
        "query": Q,
        "tasks": 24,
        "modules": [DEFAULT_MODULE_ID],
        "rows": 831,
        "samples_per_epoch": SAMPLES,
        "unused_rows_per_epoch": 831 - SAMPLES * (K + Q),
        "skipped_tasks": 0,
        "windows": 5,
        "window_rows": 187,
        "memory_budget_mb": BUDGET_MB,
    }


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("modules", "gamma"), [(None, None), (("walker", "runner"), None), (None, 0.9)]
)
def test_one_window_gives_exactly_the_in_memory_batches(tmp_path, ray_session, modules, gamma):
    _write_sorted(tmp_path, SIZES, modules=modules)
    episodes = read_episodes(tmp_path)
    chosen = None if modules is None else ["walker"]
    options = {"support": K, "query": Q, "modules_to_update": chosen, "gamma": gamma}
    in_memory = task_samples(episodes, **options)
    streamed = task_samples(episodes, mode="stream", memory_budget_mb=64, **options)
    assert streamed.columns == in_memory.columns
    assert ("returns" in streamed.columns) == (gamma is not None)
    assert isinstance(in_memory, TaskSamples) and isinstance(streamed, TaskWindows)
    assert len(streamed.windows) == 1
    per_epoch = in_memory.samples_per_epoch // 5
    count = 2 * per_epoch + 1  # two epochs and the first batch of a third

    [expected], _, _ = _take(in_memory, count, minibatch_size=5, seed=3)
    [got], [state], _ = _take(streamed, count, minibatch_size=5, seed=3)

    _assert_equal_batches(got, expected)
    assert (state["epoch"], state["batches_consumed"], state["kind"]) == (2, 1, "task_windows")


@pytest.mark.timeout(120)
def test_windows_derive_returns_from_their_own_whole_episodes(sorted_dir, ray_session):
    columns = ["eps_id", "t", "rewards", "returns", "returns_truncated"]
    options = {"support": K, "query": Q, "columns": columns, "gamma": 0.9}
    in_memory = task_samples(read_episodes(sorted_dir), **options)
    streamed = task_samples(
        inspect_episodes(sorted_dir), mode="stream", memory_budget_mb=BUDGET_MB, **options
    )
    # 29 bytes a row: eps_id 8, t 4, rewards 4, terminateds 1, task_id codes 4, and 4 for
    # each derived column.
    assert (streamed.window_rows, len(streamed.windows)) == (271, 4)
    assert streamed.columns == ("eps_id", "t", "rewards", "returns", "returns_truncated")
    read = [streamed.read_window(i).arrays for i in range(len(streamed.windows))]
    for name in streamed.columns:
        # Windows hold consecutive whole tasks in the in-memory order: together, every row.
        joined = np.concatenate([arrays[name] for arrays in read])
        assert joined.dtype == in_memory.arrays[name].dtype
        assert np.array_equal(joined, in_memory.arrays[name]), name
    # Episodes of 5 steps never end with terminateds: every row's return is truncated, and
    # the last step's return is its reward.
    assert in_memory.arrays["returns_truncated"].all()
    assert in_memory.arrays["t"][4] == 4
    assert in_memory.arrays["returns"][4] == in_memory.arrays["rewards"][4]


@pytest.mark.timeout(120)
def test_windows_read_other_layouts_as_the_in_memory_path_does(tmp_path, ray_session):
    # Names from a column map, observations as fixed_size_list, int64 steps.
    _write_sorted(tmp_path / "canonical", SIZES, files=1)
    table = pq.read_table(tmp_path / "canonical" / "part-0.parquet")
    obs = table.column("obs").combine_chunks().storage
    table = table.set_column(table.schema.get_field_index("obs"), "state", obs)
    table = table.set_column(1, "step", table.column("t").cast(pa.int64()))
    table = table.rename_columns(["goal" if n == "task_id" else n for n in table.column_names])
    (tmp_path / "other").mkdir()
    pq.write_table(table, tmp_path / "other" / "part-0.parquet", row_group_size=16)
    episodes = read_episodes(
        tmp_path / "other", column_map={"obs": "state", "t": "step", "task_id": "goal"}
    )
    options = {"support": K, "query": Q, "columns": ["obs", "t", "rewards"]}
    in_memory = task_samples(episodes, **options)
    streamed = task_samples(episodes, mode="stream", memory_budget_mb=64, **options)

    [expected], _, _ = _take(in_memory, 20, minibatch_size=4, seed=4)
    [got], _, _ = _take(streamed, 20, minibatch_size=4, seed=4)
    _assert_equal_batches(got, expected)
    assert got[0]["query"][DEFAULT_MODULE_ID]["t"].dtype == torch.int32


@pytest.mark.timeout(120)
def test_an_epoch_of_windows_uses_each_transition_once_and_mixes_at_most_two_windows(windows):
    window_of = {task: i for i, w in enumerate(windows.windows) for task in w.task_ids}
    per_epoch = SAMPLES // 4
    [taken], [state], [stats] = _take(windows, per_epoch + 1, minibatch_size=4, seed=5)
    epoch, following = taken[:per_epoch], taken[per_epoch]

    used, tasks, mixed = [], set(), 0
    for meta in epoch:
        support, query = _ids(meta, "support"), _ids(meta, "query")
        assert support.shape == (4, K) and query.shape == (4, Q)
        for task in range(4):
            assert len(set(TASK_OF[np.concatenate([support[task], query[task]])])) == 1
        batch_tasks = set(TASK_OF[support[:, 0]])
        batch_windows = {window_of[t] for t in batch_tasks}
        assert len(batch_windows) <= 2
        mixed += len(batch_windows) == 2
        tasks |= batch_tasks
        used.append(np.concatenate([support.ravel(), query.ravel()]))
    used = np.concatenate(used)
    assert len(used) == SAMPLES * (K + Q) and len(np.unique(used)) == len(used)
    assert tasks == set(SIZES)
    assert mixed > len(epoch) // 2  # most meta-batches draw on two windows
    # The batch after the epoch's last is the first of the next epoch.
    assert (state["epoch"], state["batches_consumed"]) == (1, 1)
    assert stats["dropped_rows"] == 831 - SAMPLES * (K + Q)
    assert following["support"][DEFAULT_MODULE_ID]["obs"].shape == (4, K, 3)
    assert stats["max_rows_held"] <= windows.held_rows_limit


@pytest.mark.timeout(120)
def test_windows_of_several_modules_group_each_meta_batch_per_module(tmp_path):
    _write_sorted(tmp_path, SIZES, modules=("walker", "runner"))
    episode = np.concatenate([np.arange(n) // 5 + 100 * i for i, n in enumerate(SIZES.values())])
    module_of = np.where(episode % 2 == 0, "walker", "runner")
    windows = task_samples(
        inspect_episodes(tmp_path), support=K, query=Q, mode="stream", memory_budget_mb=0.04
    )
    per_epoch = windows.samples_per_epoch // 4
    [epoch], _, _ = _take(windows, per_epoch, minibatch_size=4, seed=1)

    used = []
    for meta in epoch:
        assert sum(group["obs"].shape[0] for group in meta["support"].values()) == 4
        for module, group in meta["query"].items():
            rows = group["rewards"].numpy().astype(int)
            assert set(module_of[rows.ravel()]) == {module}
            support = _ids(meta, "support", module)
            assert (TASK_OF[support[:, 0]] == TASK_OF[rows[:, 0]]).all()
            used.append(np.concatenate([support.ravel(), rows.ravel()]))
    used = np.concatenate(used)
    assert windows.module_ids == ("runner", "walker") and len(windows.windows) > 2
    assert len(np.unique(used)) == len(used) == per_epoch * 4 * (K + Q)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("first", [0, 1, 5, 9, 17, 18, 23])
def test_a_windowed_stream_resumes_exactly(windows, first):
    # 18 meta-batches per epoch of 72 samples: 17 is the last of epoch 0, 23 inside epoch 1.
    [uninterrupted], _, _ = _take(windows, first + 6, minibatch_size=4, seed=2)
    [_], states, _ = _take(windows, first, minibatch_size=4, seed=2)
    [resumed], _, _ = _take(windows, 6, minibatch_size=4, seed=2, state=states)

    _assert_equal_batches(resumed, uninterrupted[first:])


def test_a_resume_reads_only_the_window_before_the_resume_point_and_its_own(windows):
    feed = TaskWindowFeed(
        windows, tasks_per_batch=4, seed=2, ranks=[0], num_learners=1, pin_memory=False
    )
    deals = feed.deals(epoch=0, skip=13)
    first = next(deals)
    deals.close()

    assert feed.stats()["windows_read"] == 2 and len(first.batches[0]) > 0


@pytest.mark.timeout(120)
def test_two_learners_with_half_the_tasks_see_what_one_learner_sees(windows):
    halves, _, _ = _take(windows, 20, minibatch_size=2, seed=7, learners=2)
    [whole], _, _ = _take(windows, 20, minibatch_size=4, seed=7)

    for step in range(20):
        for part in ("support", "query"):
            joined = np.concatenate([_ids(halves[r][step], part) for r in (0, 1)])
            np.testing.assert_array_equal(joined, _ids(whole[step], part))


@pytest.mark.timeout(120)
def test_rows_held_stay_within_two_windows_whatever_the_dataset_size(tmp_path):
    many = {f"t{i:03d}": 20 + (7 * i) % 31 for i in range(240)}
    _write_sorted(tmp_path, many, files=6, row_group_size=64)
    windows = task_samples(
        inspect_episodes(tmp_path), support=K, query=Q, mode="stream", memory_budget_mb=BUDGET_MB
    )
    epoch = windows.samples_per_epoch // 4
    [taken], _, [stats] = _take(windows, epoch, minibatch_size=4)

    assert len(windows.windows) > 40 and len(taken) == epoch
    assert all(window.rows <= windows.window_rows for window in windows.windows)
    assert windows.window_rows < stats["max_rows_held"] <= windows.held_rows_limit
    assert windows.held_rows_limit == 2 * windows.window_rows


def test_data_not_sorted_by_task_is_refused_naming_compact(tmp_path):
    first = episode_table(6, task_id=pa.array(["a", "a", "a", "c", "c", "c"]))
    second = episode_table(3, task_id=pa.array(["b", "b", "b"]), eps_id=pa.array([9, 9, 9]))
    pq.write_table(first, tmp_path / "part-0.parquet")
    pq.write_table(second, tmp_path / "part-1.parquet")

    with pytest.raises(DatasetError) as caught:
        task_samples(
            inspect_episodes(tmp_path), support=1, query=1, mode="stream", memory_budget_mb=1
        )
    assert str(caught.value) == (
        f"{tmp_path}/part-1.parquet: column 'task_id' is not sorted by task: row group 0 "
        f"holds task 'b' after task 'c' (row group 0 of {tmp_path}/part-0.parquet); "
        "streaming task samples reads whole tasks in windows and needs the rows sorted by "
        f"(task_id, eps_id, t). Rewrite the dataset with `offmeta data compact {tmp_path} "
        "--out DIR`, or read it in memory (tasks.mode: memory)"
    )


def test_tasks_interleaved_inside_a_row_group_are_refused(tmp_path):
    table = episode_table(9, task_id=pa.array(["a", "a", "a", "b", "b", "b", "a", "a", "a"]))
    pq.write_table(table, tmp_path / "part-0.parquet")

    with pytest.raises(DatasetError, match=r"row group 0 holds task 'a' after task 'b'"):
        task_samples(
            inspect_episodes(tmp_path), support=1, query=1, mode="stream", memory_budget_mb=1
        )


def test_a_task_larger_than_a_window_is_refused_with_the_budget_it_needs(sorted_dir):
    with pytest.raises(DatasetError) as caught:
        task_samples(
            inspect_episodes(sorted_dir), support=K, query=Q, mode="stream", memory_budget_mb=0.005
        )
    assert str(caught.value) == (
        "task_samples: task 't02' has 34 transitions, more than a window of 31 rows, the "
        "most that memory_budget_mb=0.005 allows at 42 bytes per row (4 copies of a window "
        "fit in the budget); raise memory_budget_mb to at least 0.006, or split the task"
    )


def test_small_tasks_are_listed_as_in_memory(tmp_path):
    _write_sorted(tmp_path, {"big": 25, "fine": 10, "short": 9, "tiny": 5})
    info = inspect_episodes(tmp_path)

    with pytest.raises(DatasetError, match=r"2 of 4 tasks have fewer than support \+ query"):
        task_samples(info, support=K, query=Q, mode="stream", memory_budget_mb=1)
    skipped = task_samples(
        info, support=K, query=Q, skip_small_tasks=True, mode="stream", memory_budget_mb=1
    )
    assert skipped.skipped_tasks == {"short": 9, "tiny": 5}
    assert skipped.task_ids == ("big", "fine") and skipped.samples_per_epoch == 3


def test_the_mode_follows_the_budget_and_arguments_are_checked(sorted_dir, ray_session):
    episodes = read_episodes(sorted_dir)
    # 831 rows x 26 bytes (obs, actions, rewards and flags) = 21,606 bytes.
    assert isinstance(task_samples(episodes, support=K, query=Q), TaskSamples)
    over = task_samples(episodes, support=K, query=Q, memory_budget_mb=0.02)
    under = task_samples(episodes, support=K, query=Q, memory_budget_mb=0.021)
    assert isinstance(over, TaskWindows) and isinstance(under, TaskSamples)
    forced = task_samples(episodes, support=K, query=Q, mode="memory", memory_budget_mb=0.02)
    assert isinstance(forced, TaskSamples)

    with pytest.raises(ValueError) as caught:
        task_samples(episodes, support=K, query=Q, mode="stream")
    assert str(caught.value) == (
        "mode='stream' needs memory_budget_mb: the windows of tasks are sized from it"
    )
    with pytest.raises(ValueError, match=r"mode must be one of auto, memory, stream, got 'disk'"):
        task_samples(episodes, support=K, query=Q, mode="disk")
    with pytest.raises(ValueError, match=r"memory_budget_mb must be > 0 \(megabytes\), got 0"):
        task_samples(episodes, support=K, query=Q, memory_budget_mb=0)
    with pytest.raises(TypeError, match=r"pass read_episodes\(\.\.\.\), not inspect_episodes"):
        task_samples(inspect_episodes(sorted_dir), support=K, query=Q)


@pytest.mark.timeout(60)
def test_a_state_of_other_windows_is_refused(windows, sorted_dir):
    [_], [state], _ = _take(windows, 3, minibatch_size=4)
    larger = task_samples(
        inspect_episodes(sorted_dir), support=K, query=Q, mode="stream", memory_budget_mb=0.06
    )
    [stream] = split_for_learners(larger, 1, minibatch_size=4)
    with stream, pytest.raises(ValueError) as caught:
        stream.restore(state)
    assert str(caught.value) == (
        f"learner-0: state was saved with window_rows=187 but this stream has "
        f"window_rows={larger.window_rows}; build the streams with the saved settings"
    )


@pytest.mark.timeout(300)
def test_training_streams_when_configured_and_one_window_trains_as_in_memory(tmp_path, ray_session):
    data = tiny_point_robot(tmp_path / "data")
    episodes = read_episodes(data / "train")
    results = {}
    for mode, budget in (("memory", 2048), ("stream", 2048), ("stream", 0.01)):
        cfg = tiny_config(
            data,
            tmp_path / f"{mode}-{budget}",
            [f"tasks.mode={mode}", f"tasks.memory_budget_mb={budget}"],
        )
        results[mode, budget] = train(cfg, episodes, run_dir=tmp_path / f"{mode}-{budget}")

    windows = results["stream", 0.01].tasks
    assert (windows["mode"], windows["windows"]) == ("stream", 6)
    assert results["stream", 2048].tasks["windows"] == 1
    one_window = results["stream", 2048].learner_state["params"]
    in_memory = results["memory", 2048].learner_state["params"]
    for module, named in in_memory.items():
        for name, tensor in named.items():
            assert torch.equal(one_window[module][name], tensor), f"{module}/{name}"
    assert (
        results["stream", 0.01].history["query_loss"]
        != results["memory", 2048].history["query_loss"]
    )
