"""Context collected in the simulator: ``evaluation.context: online``.

Before a held-out task is adapted to, the unadapted policy (the meta-parameters, before any
inner step) runs ``evaluation.context_episodes`` exploration episodes in the task's
environment, its actions sampled from the policy head (the mean for heads without a
distribution). Every step is recorded as a transition, ``obs, actions, rewards, new_obs,
terminateds, truncateds``, with ``returns`` / ``returns_truncated`` derived per recorded
episode with ``data.gamma`` (as at ingest), and these transitions are the task's support
set: the learner adapts on them through the same ``adapt`` it uses on recorded data, so the
protocol holds for every algorithm.

Vmap needs one support size for every task: each episode gives its first L steps, L =
``tasks.support_window`` when every exploration episode is at least that long, otherwise
the shortest exploration episode's length, so K = ``context_episodes`` x L (fixed-horizon
environments give whole episodes). Exploration starts from ``evaluation.seed + 1``, so its
episodes differ from the evaluation rollouts' starts (``evaluation.seed``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from flows.config import MetaTrainConfig
from flows.evaluation.environments import HeldoutEnvs
from flows.evaluation.rollouts import PolicyActions, roll_out
from learners.meta.learner import MetaLearner
from learners.models.factory import build_model
from pipeline.contract.schema import ObservationLayout
from pipeline.reads.returns import discounted_returns
from pipeline.streams.collate import Batch, finalize, gather

RECORDED = ("obs", "actions", "rewards", "new_obs", "terminateds", "truncateds")
"""The columns an exploration step records."""
DERIVED = ("returns", "returns_truncated")


class _Recorder(gym.Wrapper):
    """Records every transition of the episode it runs."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps: dict[str, list[Any]] = {name: [] for name in RECORDED}
        self._obs: Any = None

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._obs, info = self.env.reset(**kwargs)
        return self._obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        new_obs, reward, terminated, truncated, info = self.env.step(action)
        for name, value in zip(
            RECORDED, (self._obs, action, reward, new_obs, terminated, truncated), strict=True
        ):
            self.steps[name].append(value)
        self._obs = new_obs
        return new_obs, reward, terminated, truncated, info


@dataclass(frozen=True)
class OnlineContext:
    """The support sets collected for the held-out tasks, and how."""

    support: Batch
    """``{module: {column: [tasks, K, ...]}}`` on the learner's device, as finalize gives."""
    episodes: int
    steps: int
    """Steps each exploration episode gives (K = episodes x steps)."""
    lengths: list[int] = field(default_factory=list)
    """Every exploration episode's full length, task-major."""

    def describe(self) -> str:
        return f"online: {self.episodes} exploration episode(s) x {self.steps} steps per task"


def collect_online_context(
    cfg: MetaTrainConfig,
    learner: MetaLearner,
    task_ids: Sequence[str],
    envs: HeldoutEnvs,
    like: Mapping[str, np.ndarray],
    *,
    obs_layout: ObservationLayout | None = None,
) -> OnlineContext:
    """Exploration episodes of the unadapted policy in each of ``task_ids`` as support sets
    (module docstring); ``like``: the held-out samples' arrays, whose columns (those recorded
    or derived) and dtypes the support sets take."""
    settings = cfg.evaluation
    (module,) = learner.config.data_modules
    wanted = [name for name in like if name in RECORDED or name in DERIVED]
    count = settings.context_episodes
    rows = [_Recorder(envs.make(task_id)) for task_id in task_ids for _ in range(count)]
    model = build_model(learner.config.modules[module]).to(learner.device)
    generator = torch.Generator(device=learner.device).manual_seed(settings.seed + 1)
    actions = PolicyActions(model, rows[0].action_space, True, generator, obs_layout=obs_layout)
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    result = roll_out(
        rows, actions.shared(meta), seed=settings.seed + 1, max_steps=settings.max_episode_steps
    )
    for env in rows:
        env.close()
    lengths = result.lengths.tolist()
    if min(lengths) == 0:
        raise ValueError(
            "evaluation.context online: an exploration episode ended before its first step; "
            "expected every episode to take at least one step"
        )
    window = cfg.tasks.support_window
    steps = window if window is not None and min(lengths) >= window else min(lengths)
    columns = _columns(rows, cfg.data.gamma)
    starts = np.cumsum([0, *lengths[:-1]])
    index = (starts[:, None] + np.arange(steps)).reshape(len(task_ids), count * steps)
    batch = {
        name: gather(np.asarray(columns[name], dtype=like[name].dtype), index) for name in wanted
    }
    support = finalize({module: batch}, learner.device, obs_layout=obs_layout)
    return OnlineContext(support=support, episodes=count, steps=steps, lengths=lengths)


def _columns(recorders: Sequence[_Recorder], gamma: float) -> dict[str, np.ndarray]:
    """Every recorded step of ``recorders`` (episode after episode), and the derived
    columns."""
    columns = {
        name: np.asarray([value for r in recorders for value in r.steps[name]]) for name in RECORDED
    }
    lengths = np.array([len(r.steps["rewards"]) for r in recorders])
    starts = np.cumsum(np.concatenate(([0], lengths[:-1])))
    columns["returns"] = discounted_returns(columns["rewards"].astype(np.float64), starts, gamma)
    terminated = columns["terminateds"].astype(bool)[starts + lengths - 1]
    columns["returns_truncated"] = np.repeat(~terminated, lengths)
    return columns
