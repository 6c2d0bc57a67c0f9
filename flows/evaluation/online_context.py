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
  rolled out as the adapted policy's are (``PolicyActions.per_episode``);
- ``refine``: episode 1 is the unadapted policy's, theta_1 the meta-parameters; episode k's
  are theta_k = theta_{k-1} + s (a_{k-1} - theta_{k-1}), a_{k-1} adapted (as above) on
  episode k-1 alone and s ``evaluation.context_refine_step``. Each episode starts from the
  last belief and corrects it by what that belief's own episode showed, so a learner whose
  context only ever held episodes of the task's goal sees ever more of that kind; the
  support set is then one episode per task, the one with the highest return (IDAQ's
  return-based choice of in-distribution context, Wang et al. 2023), cut as above;
- ``library``: the training tasks' policies, each adapted on its recorded context, take
  turns within the episodes, a window of ``tasks.support_window`` steps each, and the
  best-scoring one runs on; the support set is each task's best-scoring window
  (``flows.evaluation.library_search``).

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
from flows.evaluation.exploration_steps import Recorded, Recorder, Windows, support_windows
from flows.evaluation.library_search import LibraryTurns, explore_with_library
from flows.evaluation.rollouts import Policy, PolicyActions, roll_out
from flows.evaluation.task_rollouts import adapt_tasks
from learners.meta.learner import MetaLearner
from learners.models.factory import build_model
from pipeline.contract.schema import ObservationLayout
from pipeline.reads.episodes import Episodes
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
    returns: list[float] = field(default_factory=list)
    """Every exploration episode's undiscounted return, task-major."""
    refine_step: float | None = None
    """``evaluation.context_refine_step`` for ``refine``, else None."""
    library: LibraryTurns | None = None
    """How ``library`` explored, else None."""

    def describe(self) -> str:
        if self.library is not None:
            turns = self.library
            return (
                f"online: {self.episodes} exploration episode(s) per task, library "
                f"({turns.policies} training tasks' policies, {turns.steps} steps each, scored "
                f"by the mean reward of their last {turns.score_steps}; context: the best "
                "window)"
            )
        line = (
            f"online: {self.episodes} exploration episode(s) x {self.steps} steps per task, "
            f"{self.explore}"
        )
        if self.refine_step is not None:
            line += f" (step {self.refine_step:g}; context: the highest-return episode)"
        return line


def collect_online_context(
    cfg: MetaTrainConfig,
    learner: MetaLearner,
    task_ids: Sequence[str],
    envs: HeldoutEnvs,
    like: Mapping[str, np.ndarray],
    *,
    obs_layout: ObservationLayout | None = None,
    train: Episodes | None = None,
) -> OnlineContext:
    """Exploration episodes in each of ``task_ids`` as support sets (module docstring);
    ``like``: the held-out samples' arrays, whose columns (those recorded or derived) and
    dtypes the support sets take; ``train``: the training data, which ``library`` draws
    its policies from."""
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

    def cut(recorded: Sequence[Sequence[Recorded]]) -> Windows:
        return support_windows(
            recorded,
            module=data_module,
            window=cfg.tasks.support_window,
            gamma=cfg.data.gamma,
            like=like,
            device=learner.device,
            obs_layout=obs_layout,
        )

    search = None
    # Each task's recorded steps that the support set is cut from.
    chosen: Sequence[Sequence[Recorded]] = episodes
    if settings.context_explore == "library":
        search = explore_with_library(cfg, learner, episodes, actions, train, starts)
        chosen = [[best] for best in search.best()]
    elif settings.context_explore == "prior":
        roll_out([r for task in episodes for r in task], unadapted, seed=starts, max_steps=steps)
    elif settings.context_explore == "posterior":
        for episode in range(count):
            policy: Policy = unadapted
            if episode > 0:
                so_far = cut([task[:episode] for task in episodes]).support
                adapted = adapt_tasks(learner, module, so_far, settings.rollout_adapt_steps)
                policy = actions.per_episode(adapted)
            roll_out([task[episode] for task in episodes], policy, seed=starts, max_steps=steps)
    else:
        belief: dict[str, torch.Tensor] | None = None
        for episode in range(count):
            if episode > 0:
                last = cut([task[episode - 1 : episode] for task in episodes]).support
                adapted = adapt_tasks(learner, module, last, settings.rollout_adapt_steps)
                belief = _step_towards(belief, meta, adapted, settings.context_refine_step)
            policy = unadapted if belief is None else actions.per_episode(belief)
            roll_out([task[episode] for task in episodes], policy, seed=starts, max_steps=steps)
        chosen = [[max(task, key=_return)] for task in episodes]
    for recorder in (r for task in episodes for r in task):
        recorder.close()
    final = cut(chosen)
    refine = settings.context_explore == "refine"
    return OnlineContext(
        support=final.support,
        episodes=count,
        steps=final.steps,
        explore=settings.context_explore,
        lengths=[r.length for task in episodes for r in task],
        returns=[_return(r) for task in episodes for r in task],
        refine_step=settings.context_refine_step if refine else None,
        library=None if search is None else search.turns,
    )


def _return(recorder: Recorder) -> float:
    """An exploration episode's undiscounted return."""
    return float(np.sum(recorder.steps["rewards"]))


def _step_towards(
    belief: dict[str, torch.Tensor] | None,
    meta: dict[str, torch.Tensor],
    adapted: dict[str, torch.Tensor],
    step: float,
) -> dict[str, torch.Tensor]:
    """``belief + step (adapted - belief)`` per task (``[tasks, ...]``), the meta-parameters
    standing for the first belief."""
    start = belief if belief is not None else {n: meta[n].expand_as(a) for n, a in adapted.items()}
    return {name: start[name] + step * (adapted[name] - start[name]) for name in adapted}
