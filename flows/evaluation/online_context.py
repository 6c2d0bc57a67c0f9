"""Context collected in the simulator: ``evaluation.context: online``.

Before a held-out task is adapted to, ``evaluation.context_episodes`` exploration episodes
run in the task's environment, actions sampled from the policy head (the mean for heads
without a distribution), every step recorded as a transition, and these transitions are the
task's support set (``flows.evaluation.exploration_steps``: each episode's first L steps,
K = ``context_episodes`` x L). The learner adapts on them through the same ``adapt`` it uses
on recorded data, so the protocol holds for every algorithm.

Which policy explores is ``evaluation.context_explore``:

- ``prior``: the unadapted policy (the meta-parameters, before any inner step) runs every
  episode, all in one ``roll_out``;
- ``posterior`` (PEARL's sequential posterior sampling): episode 1 is the unadapted
  policy's; before episode k each task's policy is adapted on its episodes 1..k-1, cut as the
  final support set is cut (the first L_k steps of each, L_k by the same rule over those
  episodes), so the adaptation sees the shapes the learner trained on. The adaptation is the
  rollouts' own (``task_rollouts.adapt_tasks`` with ``rollout_adapt_steps``), the episodes
  rolled out as the adapted policy's are (``PolicyActions.per_episode``).

Exploration starts come from one generator seeded with ``evaluation.seed + 1``, so they
differ from the evaluation rollouts' starts (``evaluation.seed``); ``posterior`` draws the
starts of episode k after those of episode k-1, so with one episode both give the same
support set.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from flows.config import ContextExplore, MetaTrainConfig
from flows.evaluation.environments import HeldoutEnvs
from flows.evaluation.exploration_steps import Recorder, Windows, support_windows
from flows.evaluation.rollouts import Policy, PolicyActions, roll_out
from flows.evaluation.task_rollouts import adapt_tasks
from learners.meta.learner import MetaLearner
from learners.models.factory import build_model
from pipeline.contract.schema import ObservationLayout
from pipeline.streams.collate import Batch


@dataclass(frozen=True)
class OnlineContext:
    """The support sets collected for the held-out tasks, and how."""

    support: Batch
    """``{module: {column: [tasks, K, ...]}}`` on the learner's device, as finalize gives."""
    episodes: int
    steps: int
    """Steps each exploration episode gives (K = episodes x steps)."""
    explore: ContextExplore
    """Which policy explored (``evaluation.context_explore``)."""
    lengths: list[int] = field(default_factory=list)
    """Every exploration episode's full length, task-major."""

    def describe(self) -> str:
        return (
            f"online: {self.episodes} exploration episode(s) x {self.steps} steps per task, "
            f"{self.explore}"
        )


def collect_online_context(
    cfg: MetaTrainConfig,
    learner: MetaLearner,
    task_ids: Sequence[str],
    envs: HeldoutEnvs,
    like: Mapping[str, np.ndarray],
    *,
    obs_layout: ObservationLayout | None = None,
) -> OnlineContext:
    """Exploration episodes in each of ``task_ids`` as support sets (module docstring);
    ``like``: the held-out samples' arrays, whose columns (those recorded or derived) and
    dtypes the support sets take."""
    settings = cfg.evaluation
    (data_module,) = learner.config.data_modules
    module = learner.config.rollout_module
    count = settings.context_episodes
    episodes = [[Recorder(envs.make(task_id)) for _ in range(count)] for task_id in task_ids]
    model = build_model(learner.config.modules[module]).to(learner.device)
    generator = torch.Generator(device=learner.device).manual_seed(settings.seed + 1)
    space = episodes[0][0].action_space
    actions = PolicyActions(model, space, True, generator, obs_layout=obs_layout)
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    unadapted = actions.shared(meta)
    starts = np.random.default_rng(settings.seed + 1)
    steps = settings.max_episode_steps

    def cut(recorded: Sequence[Sequence[Recorder]]) -> Windows:
        return support_windows(
            recorded,
            module=data_module,
            window=cfg.tasks.support_window,
            gamma=cfg.data.gamma,
            like=like,
            device=learner.device,
            obs_layout=obs_layout,
        )

    if settings.context_explore == "prior":
        roll_out([r for task in episodes for r in task], unadapted, seed=starts, max_steps=steps)
    else:
        for episode in range(count):
            policy: Policy = unadapted
            if episode > 0:
                so_far = cut([task[:episode] for task in episodes]).support
                adapted = adapt_tasks(learner, module, so_far, settings.rollout_adapt_steps)
                policy = actions.per_episode(adapted)
            roll_out([task[episode] for task in episodes], policy, seed=starts, max_steps=steps)
    for recorder in (r for task in episodes for r in task):
        recorder.close()
    final = cut(episodes)
    return OnlineContext(
        support=final.support,
        episodes=count,
        steps=final.steps,
        explore=settings.context_explore,
        lengths=[r.length for task in episodes for r in task],
    )
