"""Meta-World ML1 tasks: one manipulation skill, one task per goal position, the goal hidden
from the observation (the ML1 protocol).

A task is its ``rand_vec``, the vector Meta-World draws the object's start and the goal
from; frozen on an environment (``set_task``), every reset of that environment starts from
the same object and goal. ``ml1_goals`` takes the train goals from ML1's train tasks and the
held-out goals from its test tasks, both for one seed, so the two sets never overlap.

The scripted expert (``metaworld.policies``) reads the goal from the last three observation
components, which ML1 sets to zero: ``expert_action`` gives it the true goal there, so the
expert acts on what the stored observation does not show.

Imports metaworld on first use (it is not an offmeta dependency).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import numpy as np

GOAL_SLICE = slice(36, 39)
"""Where a Meta-World observation carries the goal (zero in ML1)."""
OBS_DIM = 39
ACTION_DIM = 4
EPISODE_STEPS = 500
"""Meta-World's ``max_path_length``: every episode is truncated at this step."""
ML1_ENVS = ("reach-v3", "push-v3")
"""The ML1 skills offmeta records and evaluates (others may work; these are tested)."""


def _metaworld() -> Any:
    try:
        import metaworld
    except ImportError as exc:
        raise ImportError(
            f"Meta-World is not installed ({exc}); install it with `pip install "
            "metaworld==3.1.1 packaging` (the `test` extra has it), or run "
            "data/samples/regenerate_metaworld.sh, which makes its own environment"
        ) from None
    return metaworld


def check_env_name(env_name: str) -> str:
    """``env_name`` when Meta-World knows it; ``ValueError`` naming the known ones otherwise."""
    known = _metaworld().env_dict.ALL_V3_ENVIRONMENTS
    if env_name not in known:
        raise ValueError(
            f"Meta-World has no environment {env_name!r}; expected one of ML1's, e.g. "
            f"{', '.join(ML1_ENVS)}"
        )
    return env_name


def ml1_goals(env_name: str, n_train: int, n_heldout: int, seed: int = 0) -> dict[str, list]:
    """The first ``n_train`` train and ``n_heldout`` test ``rand_vec``s of
    ``metaworld.ML1(env_name, seed)`` (50 of each), as lists of floats by split."""
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        if not 1 <= n <= 50:
            raise ValueError(f"{split} goals must be between 1 and 50 (ML1 has 50), got {n}")
    ml1 = _metaworld().ML1(check_env_name(env_name), seed=seed)
    return {
        "train": [_rand_vec(task) for task in ml1.train_tasks[:n_train]],
        "heldout": [_rand_vec(task) for task in ml1.test_tasks[:n_heldout]],
    }


def _rand_vec(task: Any) -> list[float]:
    return [float(x) for x in pickle.loads(task.data)["rand_vec"]]


def make_task_env(env_name: str, rand_vec: Sequence[float], max_steps: int = EPISODE_STEPS) -> Any:
    """A Meta-World environment frozen on the task ``rand_vec``, the goal hidden, episodes
    truncated after ``max_steps`` steps."""
    metaworld = _metaworld()
    cls = metaworld.env_dict.ALL_V3_ENVIRONMENTS[check_env_name(env_name)]
    env = cls()
    data = {
        "rand_vec": np.asarray(rand_vec, dtype=np.float64),
        "env_cls": cls,
        "partially_observable": True,
    }
    env.set_task(metaworld.Task(env_name=env_name, data=pickle.dumps(data)))
    if not 1 <= max_steps <= EPISODE_STEPS:
        raise ValueError(f"max_steps must be between 1 and {EPISODE_STEPS}, got {max_steps}")
    env.max_path_length = max_steps
    return env


def expert_for(env_name: str) -> Any:
    """Meta-World's scripted policy for ``env_name``."""
    check_env_name(env_name)
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[env_name]()


def expert_action(expert: Any, obs: np.ndarray, goal: np.ndarray) -> np.ndarray:
    """The scripted ``expert``'s action for ``obs`` with the true ``goal`` written into the
    observation's goal slots, clipped to the action space, float32."""
    seen = np.array(obs, dtype=np.float64)
    seen[GOAL_SLICE] = goal
    return np.clip(expert.get_action(seen), -1.0, 1.0).astype(np.float32)
