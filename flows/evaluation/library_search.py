"""``evaluation.context_explore: library``: the training tasks' own policies, tried in turn.

The library: training tasks drawn with ``evaluation.seed`` (every one when there are no
more than the exploration has windows), each adapted (the learner's ``adapt``,
``rollout_adapt_steps``) on the context a held-out task gets offline, cut from its recorded
episodes the same way (``evaluation.context_window``). These are behaviours the learner was
trained to produce and its encoder was trained to read.

The exploration episodes are cut into windows of L = ``tasks.support_window`` steps, counted
per held-out task across its episodes (an episode's last window may be shorter). Window j
runs library policy j until each has run once; every later window runs the policy whose
window scored best in that first turn (one per task). A window's score is the mean reward
of its last ``evaluation.context_score_steps`` steps: where that policy has brought the task
by then. The support set is each task's best-scoring window (the first of equals), so the
learner adapts on the steps of the trained behaviour that came nearest the held-out task.
Policies switch within an episode: this suits tasks whose state a policy can leave (a
reach), not those a wrong move spoils (an object pushed away).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from flows.config import MetaTrainConfig
from flows.evaluation.exploration_steps import Recorder, Slice
from flows.evaluation.rollouts import Observed, Policy, PolicyActions, roll_out
from flows.evaluation.task_rollouts import adapt_tasks
from flows.stages.task_checks import context_samples
from learners.meta.learner import MetaLearner
from pipeline.reads.episodes import Episodes
from pipeline.streams.collate import finalize


def library(
    cfg: MetaTrainConfig, learner: MetaLearner, train: Episodes, size: int
) -> dict[str, torch.Tensor]:
    """Up to ``size`` training tasks' adapted parameters of the rollout module (module
    docstring), stacked ``[policies, ...]`` per name, in the training tasks' order."""
    samples = context_samples(cfg, train, learner.config.data_modules)
    batch, _ = samples.one_per_task(size, seed=cfg.evaluation.seed)
    support = finalize(batch, learner.device, obs_layout=train.schema.obs_layout)["support"]
    module = learner.config.rollout_module
    return adapt_tasks(learner, module, support, cfg.evaluation.rollout_adapt_steps)


def explore_with_library(
    cfg: MetaTrainConfig,
    learner: MetaLearner,
    episodes: Sequence[Sequence[Recorder]],
    actions: PolicyActions,
    train: Episodes | None,
    starts: np.random.Generator,
) -> LibrarySearch:
    """Runs ``episodes`` (per held-out task, ``evaluation.context_episodes`` recorders) with
    the library (module docstring), from ``starts``; the search then knows each task's best
    window."""
    if train is None:
        raise ValueError(
            "evaluation.context_explore 'library' draws its policies from the training "
            "tasks: pass their data (train=)"
        )
    settings = cfg.evaluation
    window = cfg.tasks.support_window
    assert window is not None  # MetaTrainConfig refuses library without one
    count, steps = settings.context_episodes, settings.max_episode_steps
    search = LibrarySearch(
        episodes,
        library(cfg, learner, train, count * -(-steps // window)),
        actions,
        window=window,
        score_steps=settings.context_score_steps,
    )
    for episode in range(count):
        policy = search.policy(episode)
        roll_out([task[episode] for task in episodes], policy, seed=starts, max_steps=steps)
    return search


@dataclass(frozen=True)
class LibraryTurns:
    """How a library search explored: what ``OnlineContext.describe`` reports."""

    policies: int
    """Library policies that took a turn in every held-out task (fewer than the library's
    when the episodes ended first)."""
    steps: int
    """Steps of each policy's turn (``tasks.support_window``)."""
    score_steps: int
    """``evaluation.context_score_steps``."""


@dataclass
class _Window:
    episode: int
    start: int
    policy: int
    """The library policy it ran."""


class LibrarySearch:
    """The windows of every held-out task's exploration episodes (module docstring): build
    it, ``policy(episode)`` for each episode's ``roll_out`` in turn, then ``best()``."""

    def __init__(
        self,
        episodes: Sequence[Sequence[Recorder]],
        policies: dict[str, torch.Tensor],
        actions: PolicyActions,
        *,
        window: int,
        score_steps: int,
    ) -> None:
        self._episodes = episodes
        self._policies = policies
        self._actions = actions
        self._window = window
        self._score_steps = score_steps
        self.size = next(iter(policies.values())).shape[0]
        self._windows: list[list[_Window]] = [[] for _ in episodes]
        self._best: list[int | None] = [None] * len(episodes)

    def policy(self, episode: int) -> Policy:
        """The policy of episode ``episode`` of every task: each row acts with the library
        policy its current window runs."""
        chosen = np.zeros(len(self._episodes), dtype=np.int64)
        current: Policy | None = None

        def act(observed: Observed) -> np.ndarray:
            nonlocal current
            for row in observed.rows:
                if self._episodes[row][episode].length % self._window == 0:
                    chosen[row] = self._next(row, episode)
                    current = None
            if current is None:
                index = torch.from_numpy(chosen)
                params = {name: p[index.to(p.device)] for name, p in self._policies.items()}
                current = self._actions.per_episode(params)
            return current(observed)

        return act

    @property
    def turns(self) -> LibraryTurns:
        """How the exploration went so far."""
        tried = min(min(len(windows), self.size) for windows in self._windows)
        return LibraryTurns(tried, self._window, self._score_steps)

    def best(self) -> list[Slice]:
        """Each task's best-scoring window."""
        found = []
        for task, windows in enumerate(self._windows):
            scores = [self._score(task, w) for w in windows]
            chosen = windows[int(np.argmax(scores))]
            recorder = self._episodes[task][chosen.episode]
            found.append(Slice(recorder, chosen.start, chosen.start + self._window))
        return found

    def _next(self, task: int, episode: int) -> int:
        """The library policy of ``task``'s next window, which starts now."""
        windows = self._windows[task]
        if len(windows) < self.size:
            policy = len(windows)
        else:
            if self._best[task] is None:
                scores = [self._score(task, w) for w in windows]
                self._best[task] = windows[int(np.argmax(scores))].policy
            policy = self._best[task]
        start = self._episodes[task][episode].length
        windows.append(_Window(episode, start, policy))
        return policy

    def _score(self, task: int, window: _Window) -> float:
        rewards = self._episodes[task][window.episode].steps["rewards"]
        steps = rewards[window.start : window.start + self._window][-self._score_steps :]
        return float(np.mean(steps))
