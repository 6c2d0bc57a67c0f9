"""Synthetic generators: deterministic, canonical on disk, faithful to their task family;
and the point-robot environment used later for evaluation rollouts."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import PointRobotTasks, SinusoidTasks, generate
from pipeline.synthetic.point_robot import (
    EPISODE_STEPS,
    MAX_ACTION,
    START_NOISE,
    PointRobotEnv,
    expert_actions,
    rollout_returns,
    sample_goals,
)
from tests.helpers.tolerances import largest, rounding_tolerance

F32 = np.float32


def _fingerprints(out) -> tuple[str, str]:
    return tuple(inspect_episodes(out / split).fingerprint for split in ("train", "heldout"))


@pytest.mark.parametrize("family", [SinusoidTasks(points=5), PointRobotTasks(episodes_per_task=2)])
def test_same_seed_same_fingerprint_other_seed_other(tmp_path, family):
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        generate(family, tmp_path / name, tasks=6, heldout_tasks=2, seed=seed)
    assert _fingerprints(tmp_path / "a") == _fingerprints(tmp_path / "b")
    other = _fingerprints(tmp_path / "c")
    assert other[0] != _fingerprints(tmp_path / "a")[0]
    assert other[1] != _fingerprints(tmp_path / "a")[1]


def test_heldout_tasks_do_not_depend_on_the_number_of_train_tasks(tmp_path):
    generate(SinusoidTasks(points=4), tmp_path / "small", tasks=3, heldout_tasks=2)
    generate(SinusoidTasks(points=4), tmp_path / "large", tasks=9, heldout_tasks=2)
    small, large = (inspect_episodes(tmp_path / n / "heldout") for n in ("small", "large"))
    assert small.metadata["tasks"] == large.metadata["tasks"]


def test_sinusoid_round_trip(tmp_path):
    written = generate(
        SinusoidTasks(points=20), tmp_path, tasks=12, heldout_tasks=3, seed=1, rows_per_file=100
    )
    train = inspect_episodes(written["train"])

    assert train.summary() | {"fingerprint": None, "root": None} == {
        "id": "sinusoid",
        "split": "train",
        "root": None,
        "files": 3,
        "rows": 240,
        "episodes": 12,
        "tasks": 12,
        "modules": ["default_policy"],
        "obs_shape": [1],
        "action_shape": [1],
        "discrete_actions": False,
        "fingerprint": None,
    }
    assert train.metadata["generator"] == {
        "name": "sinusoid",
        "args": {"points": 20, "tasks": 12, "heldout_tasks": 3, "seed": 1, "rows_per_file": 100},
    }
    table = pa.concat_tables(pq.read_table(f) for f in train.files)
    assert isinstance(table.schema.field("obs").type, pa.FixedShapeTensorType)
    task_ids = table.column("task_id").to_pylist()
    assert task_ids == sorted(task_ids)
    assert set(task_ids) == set(train.task_ids) == set(train.metadata["tasks"])
    x = table.column("obs").combine_chunks().to_numpy_ndarray()[:, 0]
    y = table.column("actions").combine_chunks().to_numpy_ndarray()[:, 0]
    params = [train.metadata["tasks"][t] for t in task_ids]
    amplitude = np.array([p["amplitude"] for p in params])
    phase = np.array([p["phase"] for p in params])
    # x and y were rounded once each to float32; y moves by at most amplitude * |dx|.
    magnitude = largest([amplitude]) * largest([x]) + largest([y])
    atol = rounding_tolerance(F32, magnitude=magnitude, ops=1)
    np.testing.assert_allclose(y, amplitude * np.sin(x - phase), rtol=0, atol=atol)
    assert (amplitude >= 0.1).all() and (amplitude <= 5.0).all()
    assert (np.abs(x) <= 5.0).all()
    truncated = table.column("truncateds").to_numpy()
    np.testing.assert_array_equal(truncated, table.column("t").to_numpy() == 19)
    heldout = inspect_episodes(written["heldout"])
    assert heldout.task_ids == ("heldout-00000", "heldout-00001", "heldout-00002")
    assert not set(heldout.task_ids) & set(train.task_ids)


def test_point_robot_round_trip_follows_the_environment(tmp_path):
    written = generate(PointRobotTasks(episodes_per_task=3), tmp_path, tasks=4, heldout_tasks=2)
    train = inspect_episodes(written["train"])
    assert (train.num_rows, train.num_episodes, len(train.task_ids)) == (240, 12, 4)
    assert train.schema.has_new_obs and train.schema.eps_id_type == "int64"

    table = pq.read_table(train.files[0])
    obs, new_obs, actions = (
        table.column(c).combine_chunks().to_numpy_ndarray() for c in ("obs", "new_obs", "actions")
    )
    goals = np.array(
        [train.metadata["tasks"][t]["goal"] for t in table.column("task_id").to_pylist()]
    )
    assert (np.abs(actions) <= MAX_ACTION).all()
    # Positions are float64 in the environment: obs and new_obs are each rounded once to
    # float32, and so is their float32 sum here.
    atol = rounding_tolerance(F32, magnitude=largest([obs, new_obs]), ops=3)
    np.testing.assert_allclose(new_obs, obs + actions, rtol=0, atol=atol)
    # The reward (minus a distance, which moves by at most what new_obs does) was rounded
    # once to float32, and new_obs once per coordinate.
    rewards = table.column("rewards").to_numpy()
    distance = np.linalg.norm(new_obs - goals, axis=-1)
    atol = rounding_tolerance(F32, magnitude=largest([rewards]) + largest([new_obs]), ops=2)
    np.testing.assert_allclose(rewards, -distance, rtol=0, atol=atol)
    # Goals are recorded to 6 decimals: each coordinate within 5e-7, the norm within sqrt(2)
    # times that, plus the float64 rounding of the norm.
    atol = 2**0.5 * 5e-7 + rounding_tolerance(np.float64, magnitude=1.0, ops=4)
    np.testing.assert_allclose(np.linalg.norm(goals, axis=-1), 1.0, rtol=0, atol=atol)
    assert (goals[:, 1] >= 0).all()
    steps = table.column("t").to_numpy()
    # Starts are uniform within START_NOISE, then rounded once to float32.
    bound = START_NOISE + rounding_tolerance(F32, magnitude=START_NOISE, ops=1)
    assert (np.abs(obs[steps == 0]) <= bound).all()
    assert table.column("truncateds").to_numpy().sum() == 12
    assert not table.column("terminateds").to_numpy().any()


def test_point_robot_behaviours_mixed_shares_are_exact_and_recorded(tmp_path):
    family = PointRobotTasks(episodes_per_task=4, behavior="mixed", random_share=0.5)
    written = generate(family, tmp_path / "mixed", tasks=6, heldout_tasks=1)
    train = inspect_episodes(written["train"])
    assert "behavior" in train.schema.extra_columns
    assert train.metadata["generator"]["args"]["behavior"] == "mixed"
    assert train.metadata["description"].endswith(
        "mixed, 0.5 random policy and the rest noisy expert"
    )
    table = pq.read_table(train.files[0])
    behavior = np.array(table.column("behavior").to_pylist())
    eps = table.column("eps_id").to_numpy()
    tasks = table.column("task_id").to_pylist()
    actions = table.column("actions").combine_chunks().to_numpy_ndarray()
    obs = table.column("obs").combine_chunks().to_numpy_ndarray()
    for task_id, described in train.metadata["tasks"].items():
        rows = np.array([t == task_id for t in tasks])
        episodes = sorted(set(eps[rows].tolist()))
        # dataset.json lists each of the task's episodes' behaviour, in eps_id order.
        per_episode = [behavior[eps == e][0] for e in episodes]
        assert described["behaviors"] == per_episode
        assert sorted(per_episode) == ["noisy_expert"] * 2 + ["random"] * 2
        for e in episodes:
            assert len(set(behavior[eps == e])) == 1  # one behaviour per episode
    # Noisy-expert episodes head for their goal; random ones do not on average.
    goals = np.array([train.metadata["tasks"][t]["goal"] for t in tasks])
    toward = np.sum(actions * (goals - obs), axis=-1)
    assert toward[behavior == "noisy_expert"].mean() > 5 * abs(toward[behavior == "random"].mean())
    # The default behaviour writes no behaviour column; the expert moves without noise.
    noisy = inspect_episodes(
        generate(PointRobotTasks(), tmp_path / "noisy", tasks=1, heldout_tasks=1)["train"]
    )
    assert "behavior" not in noisy.schema.extra_columns
    expert_dir = generate(
        PointRobotTasks(behavior="expert"), tmp_path / "expert", tasks=2, heldout_tasks=1
    )
    expert = pq.read_table(inspect_episodes(expert_dir["train"]).files[0])
    speeds = np.linalg.norm(expert.column("actions").combine_chunks().to_numpy_ndarray(), axis=-1)
    first = expert.column("t").to_numpy() == 0
    # From the start (within 0.05 of the origin, 1 from the goal) the expert moves at full speed.
    np.testing.assert_allclose(speeds[first], MAX_ACTION, rtol=0, atol=1e-7)


def test_point_robot_refuses_unknown_behaviours_and_fractional_episode_shares():
    with pytest.raises(ValueError) as caught:
        PointRobotTasks(behavior="greedy")
    assert str(caught.value) == "behavior must be one of expert, noisy, mixed, got 'greedy'"
    with pytest.raises(ValueError) as caught:
        PointRobotTasks(behavior="mixed", random_share=0.5, episodes_per_task=5)
    assert str(caught.value) == (
        "random_share 0.5 of 5 episodes per task is 2.5 episodes; expected a share that gives "
        "whole episodes, e.g. 0.4"
    )


def test_generate_refuses_a_used_directory_and_bad_counts(tmp_path):
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "old.parquet").write_text("x")
    with pytest.raises(ValueError) as caught:
        generate(SinusoidTasks(), tmp_path, tasks=2, heldout_tasks=1)
    assert str(caught.value) == (
        f"{tmp_path / 'train'} already holds files; expected a new or empty directory "
        "(delete it to regenerate)"
    )
    assert not (tmp_path / "heldout").exists()
    with pytest.raises(ValueError, match=r"^heldout tasks must be at least 1, got 0$"):
        generate(SinusoidTasks(), tmp_path / "new", tasks=2, heldout_tasks=0)
    with pytest.raises(ValueError, match=r"^random_fraction must be in \[0, 1\], got 2\.0$"):
        PointRobotTasks(random_fraction=2.0)


def test_environment_clips_rewards_and_truncates():
    env = PointRobotEnv(np.array([[1.0, 0.0], [0.0, 1.0]]), max_steps=2, start_noise=0.0)
    obs = env.reset(np.random.default_rng(0))
    np.testing.assert_array_equal(obs, np.zeros((2, 2), np.float32))
    obs, rewards, terminateds, truncateds = env.step(np.array([[5.0, 0.0], [0.0, -5.0]]))
    # Each rounded once from float64 to float32.
    atol = rounding_tolerance(F32, magnitude=0.1, ops=1)
    np.testing.assert_allclose(obs, [[0.1, 0.0], [0.0, -0.1]], rtol=0, atol=atol)
    atol = rounding_tolerance(F32, magnitude=1.1, ops=1)
    np.testing.assert_allclose(rewards, [-0.9, -1.1], rtol=0, atol=atol)
    assert not terminateds.any() and not truncateds.any()
    *_, truncateds = env.step(np.zeros((2, 2)))
    assert truncateds.all()
    with pytest.raises(RuntimeError, match=r"^episodes ended after 2 steps; call reset\(\)$"):
        env.step(np.zeros((2, 2)))


def test_noiseless_expert_reaches_its_goal():
    rng = np.random.default_rng(0)
    goals = sample_goals(rng, 8)
    env = PointRobotEnv(goals)
    obs = env.reset(rng)
    for _ in range(20):
        actions = expert_actions(obs, goals, rng, noise_std=0.0, random_fraction=0.0)
        obs, rewards, _, _ = env.step(actions)
    # Every goal is at most 1 + START_NOISE * sqrt(2) < 2 = 20 * MAX_ACTION away, so the robot
    # sits on it, but for rounding: its float32 observation and action (each a 2-vector of
    # size about 1, rounded once per coordinate) and the float32 reward.
    assert (-rewards <= rounding_tolerance(F32, magnitude=largest([goals]), ops=5)).all()


def test_rollout_returns_rows_follow_their_goals():
    goals = sample_goals(np.random.default_rng(1), 6)

    def cheating_policy(obs: np.ndarray) -> np.ndarray:
        # Row i must be the episode of goals[i], or this policy walks the wrong way.
        return np.clip(goals - obs, -MAX_ACTION, MAX_ACTION)

    starts = []

    def standing_still(obs: np.ndarray) -> np.ndarray:
        starts.append(obs)
        return np.zeros_like(obs)

    expert = rollout_returns(cheating_policy, goals, seed=2)
    still = rollout_returns(standing_still, goals, seed=2)
    assert expert.shape == (6,)
    assert (expert > still).all()
    np.testing.assert_array_equal(expert, rollout_returns(cheating_policy, goals, seed=2))
    # Standing still earns minus the distance from the start at each of the 20 steps; the
    # float32 start (rounded once) and each float32 reward (rounded once) explain the rest.
    distance = np.linalg.norm(goals - starts[0], axis=-1)
    assert len(starts) == EPISODE_STEPS
    atol = rounding_tolerance(F32, magnitude=EPISODE_STEPS * largest([distance]), ops=2)
    np.testing.assert_allclose(still, -EPISODE_STEPS * distance, rtol=0, atol=atol)
