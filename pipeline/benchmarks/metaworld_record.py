"""Record offline ML1 datasets: Meta-World's scripted experts, given the true goal, at
several action-noise levels plus a uniform random policy, written in offmeta's canonical
layout (``OUT/train``, ``OUT/heldout``, ``dataset.json`` with each task's ``rand_vec``).

    python -m pipeline.benchmarks.metaworld_record --env push-v3 --out DIR

Per goal, ``episodes_per_goal`` episodes cycle through the behaviours (``noise_<sd>`` for
each noise level, then ``random``), so every goal has each behaviour's share; an episode's
behaviour is in the ``behavior`` column and in ``dataset.json``. Actions are clipped to
``[-1, 1]`` (Meta-World's action space) before they are stored and stepped. ``success``
(Meta-World's ``info["success"]`` after each step) passes through as a column. The stored
observation keeps the goal hidden (zeros in ``obs[36:39]``, as ML1 gives it).

Same arguments, same bytes: goals come from ``metaworld.ML1(env, seed)``, noise from the
seed, and the simulator is deterministic. Needs metaworld, numpy, pyarrow and pydantic only
(no torch or Ray), so a throwaway environment can run it with the repository on
``PYTHONPATH`` (``data/samples/regenerate_metaworld.sh``).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pipeline.benchmarks.metaworld_tasks import (
    ACTION_DIM,
    EPISODE_STEPS,
    OBS_DIM,
    check_env_name,
    expert_action,
    expert_for,
    make_task_env,
    ml1_goals,
)
from pipeline.contract.dataset_json import Space
from pipeline.synthetic.generate import ROWS_PER_FILE, SPLITS, refuse_written_splits, write_tasks
from pipeline.synthetic.point_robot_episodes import BEHAVIOR_COLUMN

RANDOM = "random"
SUCCESS_COLUMN = "success"


@dataclass(frozen=True)
class ML1Episodes:
    """Generator arguments of an ML1 dataset (recorded in ``dataset.json``)."""

    env: str = "push-v3"
    episodes_per_goal: int = 12
    max_steps: int = EPISODE_STEPS
    """Steps per episode (Meta-World truncates at 500)."""
    noise: tuple[float, ...] = (0.1, 0.5, 1.0)
    """Standard deviations of the Gaussian noise added to the expert's actions, one
    behaviour each."""
    random_policy: bool = True
    """Whether a uniform random policy is one of the behaviours."""
    behaviors_cycle: tuple[str, ...] = field(init=False)
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    """Called with a line after each goal's episodes (recording takes minutes)."""

    name: ClassVar[str] = "metaworld_ml1"

    def __post_init__(self) -> None:
        check_env_name(self.env)
        if self.episodes_per_goal < 1:
            raise ValueError(f"episodes_per_goal must be at least 1, got {self.episodes_per_goal}")
        if not 1 <= self.max_steps <= EPISODE_STEPS:
            raise ValueError(
                f"max_steps must be between 1 and {EPISODE_STEPS}, got {self.max_steps}"
            )
        if any(sd < 0 for sd in self.noise):
            raise ValueError(f"noise levels must be >= 0, got {list(self.noise)}")
        cycle = tuple(f"noise_{sd:g}" for sd in self.noise) + (
            (RANDOM,) if self.random_policy else ()
        )
        if not cycle:
            raise ValueError("no behaviour: give a noise level or keep the random policy")
        object.__setattr__(self, "behaviors_cycle", cycle)

    @property
    def description(self) -> str:
        return (
            f"Meta-World ML1 {self.env}, goal hidden: the scripted expert given the goal, "
            f"with action noise sd {', '.join(f'{sd:g}' for sd in self.noise)}"
            + (", and a uniform random policy" if self.random_policy else "")
        )

    @property
    def rows_per_task(self) -> int:
        return self.episodes_per_goal * self.max_steps

    def spaces(self) -> tuple[Space, Space]:
        return Space(kind="box", shape=(OBS_DIM,)), Space(
            kind="box", shape=(ACTION_DIM,), low=-1.0, high=1.0
        )

    def behaviors(self) -> list[str]:
        """Each episode's behaviour, in a goal's episode order."""
        cycle = self.behaviors_cycle
        return [cycle[e % len(cycle)] for e in range(self.episodes_per_goal)]

    def task_params(self, rand_vecs: Sequence[Sequence[float]]) -> list[dict[str, Any]]:
        """The ``dataset.json`` entry of each goal: env, ``rand_vec``, the goal position the
        environment derives from it, and the episodes' behaviours."""
        params = []
        for rand_vec in rand_vecs:
            env = make_task_env(self.env, rand_vec, self.max_steps)
            env.reset()
            goal = [round(float(x), 6) for x in env._target_pos]
            env.close()
            params.append(
                {
                    "env_name": self.env,
                    "rand_vec": list(rand_vec),
                    "goal": goal,
                    "behaviors": self.behaviors(),
                }
            )
        return params

    def episodes(
        self,
        rng: np.random.Generator,
        tasks: list[dict[str, Any]],
        task_ids: list[str],
        first_task: int,
    ) -> dict[str, np.ndarray]:
        expert = expert_for(self.env)
        steps, per_task = self.max_steps, self.episodes_per_goal
        n = len(tasks) * per_task * steps
        obs = np.empty((n, OBS_DIM), np.float32)
        new_obs = np.empty((n, OBS_DIM), np.float32)
        actions = np.empty((n, ACTION_DIM), np.float32)
        rewards = np.empty(n, np.float32)
        success = np.empty(n, bool)
        truncateds = np.zeros(n, bool)
        behaviors = []
        row = 0
        for task in tasks:
            env = make_task_env(self.env, task["rand_vec"], steps)
            for behavior in task["behaviors"]:
                o, _ = env.reset()
                goal = np.asarray(env._target_pos, dtype=np.float64)
                for _ in range(steps):
                    if behavior == RANDOM:
                        a = rng.uniform(-1.0, 1.0, ACTION_DIM).astype(np.float32)
                    else:
                        sd = self.noise[self.behaviors_cycle.index(behavior)]
                        a = expert_action(expert, o, goal) + rng.normal(0.0, sd, ACTION_DIM)
                        a = np.clip(a, -1.0, 1.0).astype(np.float32)
                    o2, r, _, truncated, info = env.step(a)
                    obs[row], actions[row], new_obs[row] = o, a, o2
                    rewards[row], success[row] = r, bool(info["success"])
                    truncateds[row] = truncated
                    row += 1
                    o = o2
                truncateds[row - 1] = True
                behaviors.extend([behavior] * steps)
            env.close()
            done = row // (per_task * steps)
            if self.progress is not None:
                self.progress(f"{self.env}: recorded goal {task_ids[done - 1]} ({row} rows)")
        n_episodes = len(tasks) * per_task
        first_episode = first_task * per_task
        return {
            "eps_id": np.repeat(np.arange(first_episode, first_episode + n_episodes), steps),
            "t": np.tile(np.arange(steps, dtype=np.int32), n_episodes),
            "obs": obs,
            "actions": actions,
            "rewards": rewards,
            "terminateds": np.zeros(n, bool),
            "truncateds": truncateds,
            "new_obs": new_obs,
            BEHAVIOR_COLUMN: np.array(behaviors),
            SUCCESS_COLUMN: success,
        }


def record(
    family: ML1Episodes,
    out: str | Path,
    *,
    train_goals: int = 40,
    heldout_goals: int = 10,
    seed: int = 0,
    rows_per_file: int = ROWS_PER_FILE,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write ``OUT/train`` (ML1's first ``train_goals`` train goals) and ``OUT/heldout``
    (its first ``heldout_goals`` test goals); refuses a split directory that holds files."""
    out = Path(out)
    refuse_written_splits(out)
    goals = ml1_goals(family.env, train_goals, heldout_goals, seed=seed)
    arguments = {
        **{k: v for k, v in asdict(family).items() if k not in ("behaviors_cycle", "progress")},
        "noise": list(family.noise),
        "train_goals": train_goals,
        "heldout_goals": heldout_goals,
        "seed": seed,
        "rows_per_file": rows_per_file,
    }
    streams = dict(zip(SPLITS, np.random.SeedSequence(seed).spawn(len(SPLITS)), strict=True))
    return {
        split: write_tasks(
            family,
            out / split,
            split,
            family.task_params(goals[split]),
            np.random.default_rng(streams[split]),
            arguments,
            rows_per_file,
            progress,
        )
        for split in SPLITS
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.benchmarks.metaworld_record", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--env", default="push-v3", help="ML1 environment (default push-v3)")
    parser.add_argument("--out", required=True, help="output folder (train/ and heldout/)")
    parser.add_argument("--train-goals", type=int, default=40)
    parser.add_argument("--heldout-goals", type=int, default=10)
    parser.add_argument("--episodes-per-goal", type=int, default=12)
    parser.add_argument("--max-steps", type=int, default=EPISODE_STEPS)
    parser.add_argument(
        "--noise",
        default="0.1,0.5,1.0",
        help="comma-separated action-noise sds (default 0.1,0.5,1.0)",
    )
    parser.add_argument("--no-random", action="store_true", help="leave out the random policy")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        noise = tuple(float(x) for x in args.noise.split(",") if x.strip())
        family = ML1Episodes(
            env=args.env,
            episodes_per_goal=args.episodes_per_goal,
            max_steps=args.max_steps,
            noise=noise,
            random_policy=not args.no_random,
            progress=lambda line: print(line, flush=True),
        )
        start = time.perf_counter()
        written = record(
            family,
            args.out,
            train_goals=args.train_goals,
            heldout_goals=args.heldout_goals,
            seed=args.seed,
            progress=lambda line: print(line, flush=True),
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"recorded {', '.join(map(str, written.values()))} in {time.perf_counter() - start:.1f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
