"""Stage 3 of a run: how well the meta-learned initialisation adapts to held-out tasks.

Two measures, both on tasks the learner never trained on:

- query loss after 0, 1, 5, 10 inner steps on each task's K support transitions
  (``MetaLearner.evaluate_tasks``, the same inner rule as training), kept per task;
- when the held-out tasks have an environment (``evaluation.env``, or the point robot's for
  point_robot data: ``flows.evaluation.environments``), ``rollout_episodes`` episodes per
  task of the unadapted meta-policy, of the policy adapted on that task's support
  transitions and, when the environment reports one, of its expert
  (``flows.evaluation.task_rollouts``): mean return ± standard error across tasks, success
  rate and episode length; beside them the mean episode return of the held-out data itself
  (the behaviour policy), to tell improvement from imitation; also what ``rollouts.png``
  draws (``flows.evaluation.trajectories``).

Each held-out task contributes exactly one sample of K support + Q query transitions,
drawn with ``evaluation.seed``, so every task weighs the same and reruns agree. The support
set (the task's *context*) is of the kind training used (``tasks.support_from``: random
transitions, or episodes of the task with the query from its other episodes), drawn from the
held-out task's recorded data; with ``evaluation.context: online`` it is collected instead
by exploration episodes in the task's environment, of the unadapted policy or of the policy
adapted on the task's earlier exploration episodes (``evaluation.context_explore``,
``flows.evaluation.online_context``). ``EvaluationReport.context`` says which.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from flows.config import MetaTrainConfig
from flows.evaluation.environments import HeldoutEnvs, heldout_envs
from flows.evaluation.online_context import collect_online_context
from flows.evaluation.task_rollouts import roll_out_tasks
from flows.evaluation.trajectories import trajectories_of
from flows.stages.task_checks import context_samples
from learners.meta.learner import MetaLearner
from pipeline.reads.episodes import Episodes
from pipeline.streams.collate import finalize
from pipeline.tasks.grouping import TaskSamples

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvaluationReport:
    """Held-out results; ``table()`` and ``format()`` show them before/after adaptation."""

    tasks: int
    """Held-out tasks evaluated."""
    support: int
    query: int
    query_loss: dict[int, float]
    """Inner steps -> mean query loss over the tasks (0: before adaptation)."""
    returns: dict[str, float] | None = None
    """Mean episode return of the ``unadapted``, ``adapted`` and ``expert`` policies, and of
    the held-out data's episodes (``behavior``)."""
    environment: str | None = None
    """The environment rolled out in: ``evaluation.env``, or the dataset's (point_robot)."""
    rollout_episodes: int = 0
    """Episodes per task in each policy's mean."""
    rollout_adapt_steps: int = 0
    task_ids: tuple[str, ...] = ()
    """The held-out tasks evaluated, in the order of ``query_loss_per_task``."""
    query_loss_per_task: dict[int, list[float]] = field(default_factory=dict)
    """Inner steps -> each task's query loss (``adaptation.png``: mean ± standard error)."""
    return_stderr: dict[str, float | None] | None = None
    """Standard error across tasks of each rolled-out policy's return (None: one task)."""
    success: dict[str, float] | None = None
    """Each rolled-out policy's share of successful episodes (``info["success"]`` or
    ``info["is_success"]`` at any step); None when the environment reports neither."""
    success_final: dict[str, float] | None = None
    """Each rolled-out policy's share of episodes that reported success at their last step."""
    episode_length: dict[str, float] | None = None
    """Each rolled-out policy's mean episode length in steps."""
    context: str = "offline: random transitions"
    """Which support sets (contexts) the held-out tasks were adapted on, and their size."""
    episodes_where: list[str] | None = None
    """The conditions ``data.episodes_where.heldout`` kept episodes by (``None``: all)."""
    trajectories: dict[str, Any] | None = field(default=None, repr=False)
    """Episodes on a few goals for ``rollouts.png`` (``flows.evaluation.trajectories``); stored as
    rollouts.json, left out of ``to_dict``."""

    def metrics(self) -> dict[str, float]:
        """Flat metrics for the artifact manifest."""
        flat = {f"heldout_query_loss_{steps}_steps": v for steps, v in self.query_loss.items()}
        for policy, value in (self.returns or {}).items():
            flat[f"heldout_return_{policy}"] = value
        for policy, error in (self.return_stderr or {}).items():
            if error is not None:
                flat[f"heldout_return_stderr_{policy}"] = error
        for policy, rate in (self.success or {}).items():
            flat[f"heldout_success_{policy}"] = rate
        for policy, rate in (self.success_final or {}).items():
            flat[f"heldout_success_final_{policy}"] = rate
        for policy, length in (self.episode_length or {}).items():
            flat[f"heldout_episode_length_{policy}"] = length
        return flat

    def table(self) -> list[dict[str, str]]:
        """Rows ``{measure, value, change}``: query loss by steps, then returns by policy."""
        before = self.query_loss[0]
        rows = []
        for steps, loss in self.query_loss.items():
            label = "before adaptation" if steps == 0 else f"after {steps} step{'s' * (steps > 1)}"
            change = "" if steps == 0 else f"{100 * (loss - before) / before:+.1f}%"
            rows.append(
                {"measure": f"query loss, {label}", "value": f"{loss:.4g}", "change": change}
            )
        if self.returns is not None:
            errors = self.return_stderr or {}
            base = self.returns["unadapted"]
            for policy, value in self.returns.items():
                change = "" if policy == "unadapted" else f"{value - base:+.3g}"
                shown = f"{value:.4g}"
                if errors.get(policy) is not None:
                    shown += f" ± {errors[policy]:.2g}"
                rows.append(
                    {"measure": f"return, {self._label(policy)}", "value": shown, "change": change}
                )
        for measure, values, digits in (
            ("success rate", self.success, ".2f"),
            ("final-step success rate", self.success_final, ".2f"),
            ("episode length", self.episode_length, ".4g"),
        ):
            for policy, value in (values or {}).items():
                change = "" if policy == "unadapted" else f"{value - values['unadapted']:+{digits}}"
                rows.append(
                    {
                        "measure": f"{measure}, {self._label(policy)}",
                        "value": f"{value:{digits}}",
                        "change": change,
                    }
                )
        return rows

    def _label(self, policy: str) -> str:
        if policy == "adapted":
            steps = self.rollout_adapt_steps
            return f"adapted ({steps} step{'s' * (steps != 1)})"
        return "behavior data" if policy == "behavior" else policy

    def format(self) -> str:
        """The table as aligned text, with a title line."""
        title = (
            f"held-out evaluation: {self.tasks} tasks, K={self.support} support / "
            f"Q={self.query} query transitions, context {self.context}"
        )
        if self.returns is not None:
            title += f", {self.rollout_episodes} {self.environment} episodes per task"
        if self.episodes_where:
            title += f", held-out episodes where {' and '.join(self.episodes_where)}"
        rows = self.table()
        columns = ("measure", "value", "change")
        widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
        lines = [title, "  ".join(c.ljust(widths[c]) for c in columns)]
        lines.append("  ".join("-" * widths[c] for c in columns))
        for row in rows:
            lines.append(
                "  ".join(
                    row[c].ljust(widths[c]) if c == "measure" else row[c].rjust(widths[c])
                    for c in columns
                )
            )
        return "\n".join(line.rstrip() for line in lines)

    def summary(self) -> str:
        """One line: the query loss before and after adaptation, and the returns."""
        losses = [
            f"{loss:.4g} "
            + ("before adaptation" if steps == 0 else f"after {steps} step{'s' * (steps > 1)}")
            for steps, loss in self.query_loss.items()
        ]
        line = f"held-out evaluation on {self.tasks} tasks: query loss {', '.join(losses)}"
        if self.returns is not None:
            line += "; return " + ", ".join(f"{k} {v:.4g}" for k, v in self.returns.items())
        if self.success is not None:
            line += "; success " + ", ".join(f"{k} {v:.2f}" for k, v in self.success.items())
        return line

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON (step counts become string keys), without the trajectories."""
        data = asdict(self)
        del data["trajectories"]
        data["query_loss"] = {str(k): v for k, v in self.query_loss.items()}
        data["query_loss_per_task"] = {str(k): v for k, v in self.query_loss_per_task.items()}
        return data


def evaluate(
    cfg: MetaTrainConfig,
    learner_state: Mapping[str, Any],
    heldout: Episodes,
    *,
    train: Episodes | None = None,
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> EvaluationReport:
    """Evaluate the learner in ``learner_state`` on ``heldout`` (see the module docstring);
    ``train``, the training data, is read only by ``evaluation.context_explore: library``."""
    logger = logger or _log
    settings = cfg.evaluation
    learner = MetaLearner.from_state(learner_state, device=cfg.training.device)
    samples = context_samples(cfg, heldout, learner.config.data_modules)
    if len(samples.module_ids) != 1:
        raise ValueError(
            f"held-out evaluation supports one module per dataset for now; the held-out data "
            f"has modules {list(samples.module_ids)}"
        )
    meta_batch, task_ids = samples.one_per_task(settings.tasks, seed=settings.seed)
    layout = heldout.schema.obs_layout
    meta_batch = finalize(meta_batch, learner.device, obs_layout=layout)
    envs = heldout_envs(cfg, heldout)
    context = _offline_context(samples)
    if settings.context == "online":
        if envs is None:
            raise ValueError(
                f"evaluation.context is online, but the held-out dataset {heldout.root} has no "
                "environment: set evaluation.env, or evaluation.context to offline"
            )
        online = collect_online_context(
            cfg, learner, task_ids, envs, samples.arrays, obs_layout=layout, train=train
        )
        meta_batch = {"support": online.support, "query": meta_batch["query"]}
        context = online.describe()
    per_task = learner.evaluate_tasks(meta_batch, steps=settings.steps)
    (module,) = samples.module_ids
    report = EvaluationReport(
        tasks=len(task_ids),
        support=int(meta_batch["support"][module]["rewards"].shape[1]),
        query=cfg.tasks.query,
        context=context,
        query_loss={steps: float(losses.mean()) for steps, losses in per_task.items()},
        task_ids=tuple(task_ids),
        query_loss_per_task={steps: losses.tolist() for steps, losses in per_task.items()},
        episodes_where=(
            None if heldout.selection is None else heldout.selection.summary()["where"]
        ),
        **_rollout_fields(
            cfg, learner, meta_batch, task_ids, samples.arrays["rewards"], heldout, envs
        ),
    )
    # One line: `offmeta run` prints the whole table once, after the run.
    logger.info("%s", report.summary())
    return report


def _rollout_fields(
    cfg: MetaTrainConfig,
    learner: MetaLearner,
    meta_batch: Mapping[str, Any],
    task_ids: Sequence[str],
    rewards: np.ndarray,
    heldout: Episodes,
    envs: HeldoutEnvs | None,
) -> dict[str, Any]:
    """The report's rollout fields; none without an environment to roll out in."""
    if envs is None:
        return {}
    settings = cfg.evaluation
    layout = heldout.schema.obs_layout
    rollouts = roll_out_tasks(learner, meta_batch, task_ids, envs, settings, obs_layout=layout)
    stats = rollouts.stats()
    returns = {policy: s.mean_return for policy, s in stats.items()}
    episodes = heldout.num_episodes if heldout.selection is None else len(heldout.selection.kept)
    returns["behavior"] = _behavior_return(rewards, episodes)
    success = {p: s.success_rate for p, s in stats.items() if s.success_rate is not None}
    final = {p: s.final_success_rate for p, s in stats.items() if s.final_success_rate is not None}
    return {
        "returns": returns,
        "environment": envs.name,
        "rollout_episodes": settings.rollout_episodes,
        "rollout_adapt_steps": settings.rollout_adapt_steps,
        "return_stderr": {policy: s.return_stderr for policy, s in stats.items()},
        "success": success or None,
        "success_final": final or None,
        "episode_length": {policy: s.mean_length for policy, s in stats.items()},
        "trajectories": trajectories_of(rollouts, settings, heldout),
    }


def _offline_context(samples: TaskSamples) -> str:
    """The recorded support sets' kind, for the report."""
    episodes = samples.episodes
    if episodes is None:
        return f"offline: {samples.support} random transitions per task"
    steps = samples.support // episodes.episodes
    if episodes.window is None:
        kind = f"{episodes.episodes} whole recorded episode(s) of {steps} steps"
    else:
        kind = f"{steps}-step windows of {episodes.episodes} recorded episode(s)"
    return f"offline: {kind} per task, query from its other episodes"


def _behavior_return(rewards: np.ndarray, episodes: int) -> float:
    """Mean undiscounted episode return of the data: every reward counted once."""
    return float(np.asarray(rewards, dtype=np.float64).sum() / episodes)
