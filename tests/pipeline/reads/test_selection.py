"""Episode selection (``episodes_where``, ``pipeline.reads.selection``) on every read path.

Rows are sorted by (task, episode, t) in two files of 16-row row groups, so episodes span
row groups and files. Every row's ``rewards`` is its row number, so the rows a read
delivers can be traced back; ``behavior`` is one label per episode and ``success`` is true
on the last step of some episodes.
"""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.contract.schema import DEFAULT_MODULE_ID, DatasetError
from pipeline.reads.episodes import inspect_episodes, read_episodes
from pipeline.reads.selection import EpisodeCondition, EpisodeFilter
from pipeline.rows.options import RowStream
from pipeline.streams.learner_stream import split_for_learners
from pipeline.tasks.samples import read_task_samples, task_samples
from tests.helpers.episode_files import episode_table

TASKS, EPISODES, STEPS = ("t0", "t1", "t2", "t3"), 6, 5
ROWS = len(TASKS) * EPISODES * STEPS  # 120
EPISODE = np.arange(ROWS) // STEPS  # episode ids 0..23, task by task
TASK = np.array(TASKS)[EPISODE // EPISODES]
BEHAVIOR = np.array(["expert", "noisy", "random"])[EPISODE % 3]
SUCCESS = (np.arange(ROWS) % STEPS == STEPS - 1) & (EPISODE % 4 != 1)
EXPERT_OR_NOISY_AND_SUCCEEDED = [
    EpisodeCondition("behavior", "in", ("expert", "noisy")),
    EpisodeCondition("success", "ever", (True,)),
]
KEPT = np.isin(BEHAVIOR, ["expert", "noisy"]) & np.isin(EPISODE, EPISODE[SUCCESS])


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    directory = tmp_path_factory.mktemp("labelled")
    for part, rows in enumerate(np.array_split(np.arange(ROWS), 2)):
        table = episode_table(
            len(rows),
            seed=part,
            eps_id=pa.array(EPISODE[rows], pa.int64()),
            t=pa.array(rows % STEPS, pa.int32()),
            rewards=pa.array(rows.astype(np.float32)),
            terminateds=pa.array(rows % STEPS == STEPS - 1),
            task_id=pa.array(TASK[rows]).dictionary_encode(),
            behavior=pa.array(BEHAVIOR[rows]).dictionary_encode(),
            success=pa.array(SUCCESS[rows]),
        )
        pq.write_table(table, directory / f"part-{part}.parquet", row_group_size=16)
    return directory


def _where(*conditions: EpisodeCondition) -> EpisodeFilter:
    return EpisodeFilter(tuple(conditions), label="data.episodes_where.train")


def _rows_of(samples) -> set[int]:
    windows = getattr(samples, "windows", None)
    if windows is None:
        return set(samples.arrays["rewards"].astype(int).tolist())
    read = (samples.read_window(i).arrays["rewards"] for i in range(len(windows)))
    return {int(row) for rewards in read for row in rewards}


def test_the_selection_counts_what_numpy_counts(dataset):
    info = inspect_episodes(dataset, episodes_where=_where(*EXPERT_OR_NOISY_AND_SUCCEEDED))

    selection = info.selection
    assert selection.kept.to_pylist() == sorted(set(EPISODE[KEPT].tolist()))
    expected_sizes = {(DEFAULT_MODULE_ID, t): int((KEPT & np.equal(TASK, t)).sum()) for t in TASKS}
    assert selection.sizes == expected_sizes
    assert info.summary()["episodes_where"] == {
        "where": ["behavior in ['expert', 'noisy']", "success ever True"],
        "episodes": len(set(EPISODE[KEPT])),
        "of_episodes": len(TASKS) * EPISODES,
        "rows": int(KEPT.sum()),
        "of_rows": ROWS,
    }


@pytest.mark.timeout(120)
def test_task_samples_keep_exactly_the_selected_rows_in_memory_and_streamed(dataset, ray_session):
    where = _where(*EXPERT_OR_NOISY_AND_SUCCEEDED)
    episodes = read_episodes(dataset, episodes_where=where)
    expected = set(np.flatnonzero(KEPT).tolist())
    options = {"support": 2, "query": 2}

    in_memory = task_samples(episodes, **options)
    in_process = read_task_samples(episodes, mode="memory", **options)
    # 0.006 MB: windows of 37 rows, one task (30 rows) each.
    streamed = task_samples(episodes, mode="stream", memory_budget_mb=0.006, **options)

    assert len(streamed.windows) == len(TASKS)
    for samples in (in_memory, in_process, streamed):
        assert _rows_of(samples) == expected
    assert in_memory.samples_per_epoch == streamed.samples_per_epoch


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options", [{"cache_budget_mb": 0}, {"materialize": True}])
def test_row_streams_deliver_only_the_selected_rows(dataset, ray_session, options):
    where = _where(EpisodeCondition("behavior", "not_in", ("random",)))
    episodes = read_episodes(dataset, episodes_where=where)
    expected = np.flatnonzero(BEHAVIOR != "random")
    [stream] = split_for_learners(
        RowStream(episodes, columns=["rewards"], **options), 1, minibatch_size=STEPS
    )
    try:
        batches = list(stream.take(len(expected) // STEPS))
    finally:
        stream.close()
    rows = np.concatenate([b[DEFAULT_MODULE_ID]["rewards"].numpy() for b in batches])
    assert sorted(rows.astype(int).tolist()) == expected.tolist()


def test_a_missing_column_is_named(dataset):
    where = _where(EpisodeCondition("behaviour", "in", ("expert",)))
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(dataset, episodes_where=where)
    assert str(caught.value) == (
        f"data.episodes_where.train: column 'behaviour' is not in dataset {dataset} (its "
        "columns: actions, behavior, eps_id, obs, rewards, success, t, task_id, terminateds, "
        "truncateds); expected a column of every file, such as a pass-through behaviour label"
    )


def test_a_filter_that_empties_a_task_names_it(dataset):
    # Episodes 1 and 5 are task t0's: t1, t2 and t3 keep none.
    where = _where(EpisodeCondition("eps_id", "in", (1, 5)))
    with pytest.raises(DatasetError) as caught:
        inspect_episodes(dataset, episodes_where=where)
    assert str(caught.value) == (
        "data.episodes_where.train keeps no episode of task 't1' in dataset "
        f"{dataset} (none of its 6 episodes has eps_id in [1, 5]) (and of 2 more tasks); "
        "loosen the filter, or leave the task out of the dataset"
    )


def test_a_value_of_another_type_is_refused(dataset):
    where = _where(EpisodeCondition("success", "ever", ("yes",)))
    with pytest.raises(DatasetError, match=re.escape("value 'yes' is not a bool")):
        inspect_episodes(dataset, episodes_where=where)
