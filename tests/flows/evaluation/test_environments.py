"""``evaluation.env``: which environment and parameters the held-out tasks get, refused
before training in one line naming the key when it cannot work, and the rollout loop over
the tasks' environments (success at any step, lengths, discrete and continuous actions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

from flows.config import ConfigError
from flows.evaluation.environments import EnvFactoryError, heldout_envs
from flows.evaluation.rollouts import Observed, PolicyActions, roll_out
from flows.stages.datasets import inspect_datasets
from pipeline.contract.schema import DatasetError
from pipeline.reads.episodes import inspect_episodes
from pipeline.synthetic import generate
from pipeline.synthetic.point_robot import EPISODE_STEPS, MAX_ACTION, PointRobotEnv, expert_step
from pipeline.synthetic.point_robot_env import PointRobotGoalEnv, point_robot_env
from tests.helpers.flow_runs import tiny_config, tiny_point_robot
from tests.helpers.line_world import LineEnv, LineWorldTasks
from tests.helpers.tolerances import largest, rounding_tolerance

ENV = "tests.helpers.line_world:line_env"
PART = "part-00000.parquet"


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 train and 4 held-out line-world tasks, 16 transitions each."""
    root = tmp_path_factory.mktemp("line_world")
    generate(LineWorldTasks(), root, tasks=12, heldout_tasks=4, seed=0)
    return root


def line_overrides(*more: str) -> list[str]:
    return [
        "learners.modules.default_policy.obs_dim=1",
        "learners.modules.default_policy.action_dim=3",
        "learners.modules.default_policy.model.head=categorical",
        "learners.modules.default_policy.loss=cross_entropy",
        f"evaluation.env={ENV}",
        *more,
    ]


def copied_heldout(data: Path, tmp_path: Path) -> Path:
    heldout = tmp_path / "heldout"
    shutil.copytree(data / "heldout", heldout)
    return heldout


def test_the_factory_gets_each_task_s_dataset_json_entry(data: Path, tmp_path: Path) -> None:
    cfg = tiny_config(data, tmp_path, line_overrides("evaluation.env_kwargs={max_steps: 3}"))
    envs = heldout_envs(cfg, inspect_episodes(data / "heldout"))
    assert envs is not None and envs.name == ENV
    tasks = json.loads((data / "heldout" / "dataset.json").read_text())["tasks"]
    assert envs.params == tasks
    env = envs.make("heldout-00003")
    assert isinstance(env, LineEnv)
    assert (env.target, env.max_steps) == (tasks["heldout-00003"]["target"], 3)


def test_point_robot_data_default_to_the_point_robot_env(tmp_path: Path) -> None:
    data = tiny_point_robot(tmp_path / "robot")
    envs = heldout_envs(tiny_config(data, tmp_path), inspect_episodes(data / "heldout"))
    assert envs is not None and envs.name == "point_robot"
    env = envs.make("heldout-00000")
    assert isinstance(env, PointRobotGoalEnv)
    assert env.goal.tolist() == envs.params["heldout-00000"]["goal"]
    assert (
        heldout_envs(
            tiny_config(data, tmp_path, ["evaluation.rollout_episodes=0"]),
            inspect_episodes(data / "heldout"),
        )
        is None
    )


def test_params_can_come_from_columns_of_the_held_out_rows(data: Path, tmp_path: Path) -> None:
    heldout = copied_heldout(data, tmp_path)
    table = pq.read_table(heldout / PART)
    targets = {
        task: params["target"]
        for task, params in json.loads((heldout / "dataset.json").read_text())["tasks"].items()
    }
    column = [targets[task] for task in table.column("task_id").to_pylist()]
    pq.write_table(table.append_column("goal_x", pa.array(column, pa.int64())), heldout / PART)
    cfg = tiny_config(
        data,
        tmp_path,
        line_overrides(f"data.heldout={heldout}", "evaluation.task_params_columns=[goal_x]"),
    )
    envs = heldout_envs(cfg, inspect_episodes(heldout))
    assert envs is not None
    assert envs.params == {task: {"goal_x": target} for task, target in targets.items()}


def test_a_column_with_two_values_in_a_task_is_refused(data: Path, tmp_path: Path) -> None:
    heldout = copied_heldout(data, tmp_path)
    table = pq.read_table(heldout / PART)
    column = pa.array(np.arange(table.num_rows) % 2, pa.int64())
    pq.write_table(table.append_column("goal_x", column), heldout / PART)
    cfg = tiny_config(
        data,
        tmp_path,
        line_overrides(f"data.heldout={heldout}", "evaluation.task_params_columns=[goal_x]"),
    )
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"held-out dataset {heldout}: column 'goal_x' (evaluation.task_params_columns) has 2 "
        "different values in task 'heldout-00000'; expected one value per task"
    )


def test_a_params_column_the_data_lacks_is_refused(data: Path, tmp_path: Path) -> None:
    cfg = tiny_config(data, tmp_path, line_overrides("evaluation.task_params_columns=[goal_x]"))
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"held-out dataset {data / 'heldout'}: evaluation.task_params_columns names column "
        "'goal_x', which it does not have; its columns are ['eps_id', 't', 'obs', 'actions', "
        "'rewards', 'terminateds', 'truncateds', 'task_id']"
    )


def test_held_out_tasks_without_parameters_are_refused(data: Path, tmp_path: Path) -> None:
    heldout = copied_heldout(data, tmp_path)
    metadata = json.loads((heldout / "dataset.json").read_text())
    del metadata["tasks"]
    (heldout / "dataset.json").write_text(json.dumps(metadata))
    cfg = tiny_config(data, tmp_path, line_overrides(f"data.heldout={heldout}"))
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"held-out dataset {heldout}: dataset.json describes no task parameters ('tasks'); "
        f"{ENV} rollouts need each task's parameters (name the columns that hold them in "
        "evaluation.task_params_columns, or set evaluation.rollout_episodes to 0)"
    )
    inspect_datasets(
        tiny_config(
            data,
            tmp_path,
            line_overrides(f"data.heldout={heldout}", "evaluation.rollout_episodes=0"),
        )
    )


def test_one_held_out_task_without_parameters_is_refused(data: Path, tmp_path: Path) -> None:
    heldout = copied_heldout(data, tmp_path)
    metadata = json.loads((heldout / "dataset.json").read_text())
    del metadata["tasks"]["heldout-00002"]
    (heldout / "dataset.json").write_text(json.dumps(metadata))
    cfg = tiny_config(data, tmp_path, line_overrides(f"data.heldout={heldout}"))
    with pytest.raises(DatasetError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == (
        f"{heldout}/dataset.json: task 'heldout-00002' occurs in column 'task_id' (1 such "
        "task(s)) but is not described in 'tasks'; expected every task id to have an entry "
        "(fix dataset.json or the files, or regenerate the dataset)"
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            "tests.helpers.no_such_module:make",
            "evaluation.env 'tests.helpers.no_such_module:make': cannot import module "
            "'tests.helpers.no_such_module' (No module named 'tests.helpers.no_such_module'); "
            "expected 'package.module:callable' importable by the run",
        ),
        (
            "tests.helpers.line_world:no_such_factory",
            "evaluation.env 'tests.helpers.line_world:no_such_factory': module "
            "'tests.helpers.line_world' has no attribute 'no_such_factory'",
        ),
        (
            "tests.helpers.line_world:NOT_CALLABLE",
            "evaluation.env 'tests.helpers.line_world:NOT_CALLABLE': 'NOT_CALLABLE' is a int, "
            "not callable; expected callable(task_id, params, **env_kwargs) -> gymnasium.Env",
        ),
    ],
)
def test_a_factory_that_cannot_be_called_is_refused_before_training(
    data: Path, tmp_path: Path, env: str, message: str
) -> None:
    cfg = tiny_config(data, tmp_path, line_overrides(f"evaluation.env={env}"))
    with pytest.raises(EnvFactoryError) as refused:
        inspect_datasets(cfg)
    assert str(refused.value) == message


def test_an_env_path_without_a_colon_is_a_config_error(data: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        tiny_config(data, tmp_path, ["evaluation.env=tests.helpers.line_world.line_env"])
    assert "evaluation.env" in str(refused.value)
    assert "expected 'package.module:callable', got 'tests.helpers.line_world.line_env'" in str(
        refused.value
    )


def test_a_factory_that_returns_no_env_is_refused(data: Path, tmp_path: Path) -> None:
    cfg = tiny_config(
        data, tmp_path, line_overrides("evaluation.env=tests.helpers.line_world:params_only")
    )
    envs = heldout_envs(cfg, inspect_episodes(data / "heldout"))
    assert envs is not None
    with pytest.raises(EnvFactoryError) as refused:
        envs.make("heldout-00000")
    assert str(refused.value) == (
        "evaluation.env 'tests.helpers.line_world:params_only' returned dict for task "
        "'heldout-00000'; expected a gymnasium.Env"
    )


def test_roll_out_counts_success_at_any_step_and_each_episode_s_length() -> None:
    envs = [LineEnv(target) for target in (2, -1, 5)]
    right = lambda observed: np.full(len(observed.rows), 2)  # noqa: E731
    result = roll_out(envs, right, seed=0, max_steps=100)
    rng = np.random.default_rng(0)  # the one generator every env starts from, in env order
    starts = [int(rng.integers(-1, 2)) for _ in envs]
    paths = [[start + k for k in range(1, 9)] for start in starts]
    targets = [env.target for env in envs]
    assert result.successes.tolist() == [t in p for t, p in zip(targets, paths, strict=True)]
    assert result.successes[1] == np.False_  # walking right never meets -1
    assert result.lengths.tolist() == [8, 8, 8]
    expected = [-sum(abs(x - t) for x in p) for t, p in zip(targets, paths, strict=True)]
    assert result.returns.tolist() == expected
    assert result.positions is None and result.goals is None
    assert roll_out(envs, right, seed=0, max_steps=3).lengths.tolist() == [3, 3, 3]


def test_roll_out_batches_the_running_episodes_into_one_policy_call() -> None:
    envs = [LineEnv(2, max_steps=steps) for steps in (1, 3)]
    seen: list[list[int]] = []

    def stay(observed: Observed) -> np.ndarray:
        seen.append(observed.rows.tolist())
        assert observed.obs.shape == (len(observed.rows), 1)
        return np.ones(len(observed.rows), dtype=np.int64)

    roll_out(envs, stay, seed=0, max_steps=10)
    assert seen == [[0, 1], [1], [1]]


def test_the_point_robot_env_reports_position_goal_and_expert_action() -> None:
    env = point_robot_env("heldout-00000", {"goal": [0.0, 1.0]})
    env.np_random = np.random.default_rng(0)
    obs, info = env.reset()
    np.testing.assert_array_equal(info["position"], obs)
    assert info["goal"].tolist() == [0.0, 1.0]
    assert info["expert_action"].dtype == np.float32
    with pytest.raises(ValueError) as refused:
        point_robot_env("heldout-00000", {"target": 1})
    assert str(refused.value) == (
        "point robot task 'heldout-00000': params {'target': 1} have no 'goal'; expected "
        "{'goal': [x, y]} (the task's entry in dataset.json 'tasks')"
    )


class _Logits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(1, 3)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs)


def test_discrete_actions_are_the_argmax_unless_sampled() -> None:
    model = _Logits()
    params = {
        "linear.weight": torch.zeros(3, 1),
        "linear.bias": torch.tensor([0.0, 0.1, 3.0]),
    }
    observed = Observed(np.zeros((64, 1), dtype=np.float32), np.arange(64), [{}] * 64)
    generator = torch.Generator().manual_seed(0)
    greedy = PolicyActions(model, LineEnv(0).action_space, False, generator)
    assert greedy.shared(params)(observed).tolist() == [2] * 64
    stacked = {name: p.expand(64, *p.shape) for name, p in params.items()}
    assert greedy.per_episode(stacked)(observed).tolist() == [2] * 64
    sampled = PolicyActions(model, LineEnv(0).action_space, True, generator)
    drawn = sampled.shared(params)(observed)
    assert set(drawn.tolist()) <= {0, 1, 2} and len(set(drawn.tolist())) > 1


class _Gaussian(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = nn.Linear(2, 2)
        self.log_std = nn.Parameter(torch.zeros(2))

    def forward(self, obs: torch.Tensor) -> dict[str, torch.Tensor]:
        mean = self.mean(obs)
        return {"mean": mean, "log_std": self.log_std.expand_as(mean)}


def test_continuous_actions_are_the_head_mean_unless_sampled() -> None:
    model = _Gaussian()
    params = {name: p.detach() for name, p in model.named_parameters()}
    space = PointRobotGoalEnv((0.0, 1.0)).action_space
    obs = np.random.default_rng(0).normal(size=(16, 2)).astype(np.float32)
    observed = Observed(obs, np.arange(16), [{}] * 16)
    mean = model(torch.from_numpy(obs))["mean"].detach().numpy()
    greedy = PolicyActions(model, space, False, torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(greedy.shared(params)(observed), mean)
    sampled = PolicyActions(model, space, True, torch.Generator().manual_seed(0))
    drawn = sampled.shared(params)(observed)
    noise = torch.randn((16, 2), generator=torch.Generator().manual_seed(0)).numpy()
    # One float32 product (by exp(0) = 1) and one sum, in torch against numpy.
    tolerance = rounding_tolerance(np.float32, magnitude=largest([mean, noise]), ops=2)
    np.testing.assert_allclose(drawn, mean + noise, rtol=0, atol=tolerance)


def test_other_action_spaces_are_refused() -> None:
    space = gym.spaces.MultiBinary(3)
    with pytest.raises(ValueError) as refused:
        PolicyActions(_Logits(), space, False, torch.Generator())
    assert str(refused.value) == (
        "evaluation rollouts act in Box or Discrete action spaces; the environment's is "
        "MultiBinary(3)"
    )


def test_the_point_robot_env_steps_exactly_as_a_row_of_the_batched_robot() -> None:
    goal = np.array([-0.31, 0.93])
    env = PointRobotGoalEnv(goal)
    env.np_random = np.random.default_rng(7)
    robot = PointRobotEnv(goal[None])
    obs, info = env.reset()
    np.testing.assert_array_equal(obs, robot.reset(np.random.default_rng(7))[0])
    # Actions inside and outside the box (clipped), and a NaN, which both let through.
    actions = np.random.default_rng(1).normal(0.0, 0.2, size=(EPISODE_STEPS, 2))
    actions[5, 1] = np.nan
    for step, action in enumerate(actions.astype(np.float32)):
        expected = np.clip(expert_step(obs[None], goal[None])[0], -MAX_ACTION, MAX_ACTION)
        np.testing.assert_array_equal(info["expert_action"], expected.astype(np.float32))
        obs, reward, terminated, truncated, info = env.step(action)
        batch_obs, rewards, terminateds, truncateds = robot.step(action[None])
        np.testing.assert_array_equal(obs, batch_obs[0])
        assert reward == float(rewards[0]) or (np.isnan(reward) and np.isnan(rewards[0]))
        assert (terminated, truncated) == (bool(terminateds[0]), bool(truncateds[0]))
        assert truncated == (step == EPISODE_STEPS - 1)
    with pytest.raises(RuntimeError) as ended:
        env.step(actions[0])
    assert str(ended.value) == "episodes ended after 20 steps; call reset()"
