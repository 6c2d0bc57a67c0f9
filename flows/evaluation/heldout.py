"""Stage 3 of a run: how well the meta-learned initialisation adapts to held-out tasks.

Two measures, both on tasks the learner never trained on:

- query loss after 0, 1, 5, 10 inner steps on each task's K support transitions
  (``MetaLearner.evaluate_tasks``, the same inner rule as training), kept per task;
- for datasets whose generator has an environment (point_robot), the mean return of
  rollouts with each task's goal: the unadapted meta-policy, the policy adapted on that
  task's support transitions, and the noise-free expert; beside them the mean episode return
  of the held-out data itself (the behaviour policy), to tell improvement from imitation;
  also the few episodes ``rollouts.png`` draws (``flows.evaluation.trajectories``).

Each held-out task contributes exactly one sample of K support + Q query transitions,
drawn with ``evaluation.seed``, so every task weighs the same and reruns agree.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, vmap

from flows.config import EvaluationConfig, MetaTrainConfig
from flows.evaluation.trajectories import TRAJECTORIES
from flows.stages.task_checks import environment_name
from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from learners.models.factory import build_model
from pipeline.reads.episodes import Episodes
from pipeline.streams.collate import finalize
from pipeline.synthetic.point_robot import expert_actions, rollout_returns
from pipeline.tasks.samples import task_samples

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
    rollout_episodes: int = 0
    """Episodes per task in each policy's mean."""
    rollout_adapt_steps: int = 0
    task_ids: tuple[str, ...] = ()
    """The held-out tasks evaluated, in the order of ``query_loss_per_task``."""
    query_loss_per_task: dict[int, list[float]] = field(default_factory=dict)
    """Inner steps -> each task's query loss (``adaptation.png``: mean ± standard error)."""
    trajectories: dict[str, Any] | None = field(default=None, repr=False)
    """Episodes on a few goals for ``rollouts.png`` (``flows.evaluation.trajectories``); stored as
    rollouts.json, left out of ``to_dict``."""

    def metrics(self) -> dict[str, float]:
        """Flat metrics for the artifact manifest."""
        flat = {f"heldout_query_loss_{steps}_steps": v for steps, v in self.query_loss.items()}
        for policy, value in (self.returns or {}).items():
            flat[f"heldout_return_{policy}"] = value
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
            base = self.returns["unadapted"]
            for policy, value in self.returns.items():
                label = policy
                if policy == "adapted":
                    steps = self.rollout_adapt_steps
                    label += f" ({steps} step{'s' * (steps != 1)})"
                elif policy == "behavior":
                    label = "behavior data"
                change = "" if policy == "unadapted" else f"{value - base:+.3g}"
                rows.append(
                    {"measure": f"return, {label}", "value": f"{value:.4g}", "change": change}
                )
        return rows

    def format(self) -> str:
        """The table as aligned text, with a title line."""
        title = (
            f"held-out evaluation: {self.tasks} tasks, K={self.support} support / "
            f"Q={self.query} query transitions"
        )
        if self.returns is not None:
            title += f", {self.rollout_episodes} {self.environment} episodes per task"
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
    logger: logging.Logger | logging.LoggerAdapter | None = None,
) -> EvaluationReport:
    """Evaluate the learner in ``learner_state`` on ``heldout`` (see the module docstring)."""
    logger = logger or _log
    settings = cfg.evaluation
    learner = MetaLearner.from_state(learner_state, device=cfg.training.device)
    samples = task_samples(
        heldout,
        support=cfg.tasks.support,
        query=cfg.tasks.query,
        modules_to_update=learner.config.data_modules,
        skip_small_tasks=cfg.tasks.skip_small_tasks,
        gamma=cfg.data.gamma,
    )
    if len(samples.module_ids) != 1:
        raise ValueError(
            f"held-out evaluation supports one module per dataset for now; the held-out data "
            f"has modules {list(samples.module_ids)}"
        )
    meta_batch, task_ids = samples.one_per_task(settings.tasks, seed=settings.seed)
    meta_batch = finalize(meta_batch, learner.device)
    per_task = learner.evaluate_tasks(meta_batch, steps=settings.steps)
    environment = environment_name(heldout.metadata)
    rollouts = _ENVIRONMENTS.get(environment) if settings.rollout_episodes > 0 else None
    returns = trajectories = None
    if rollouts is not None:
        described = heldout.metadata.get("tasks") or {}
        missing = [task_id for task_id in task_ids if task_id not in described]
        if missing:
            raise ValueError(
                f"held-out dataset {heldout.root}: dataset.json describes no parameters for "
                f"task {missing[0]!r} ({len(missing)} such tasks); {environment} rollouts need "
                "each task's parameters (or set evaluation.rollout_episodes to 0)"
            )
        returns = rollouts(learner, meta_batch, [described[t] for t in task_ids], settings)
        returns["behavior"] = _behavior_return(samples.arrays["rewards"], heldout.num_episodes)
        trajectories = TRAJECTORIES[environment](
            learner, meta_batch, task_ids, [described[t] for t in task_ids], settings, heldout
        )
    report = EvaluationReport(
        tasks=len(task_ids),
        support=cfg.tasks.support,
        query=cfg.tasks.query,
        query_loss={steps: float(losses.mean()) for steps, losses in per_task.items()},
        returns=returns,
        environment=environment if returns is not None else None,
        rollout_episodes=settings.rollout_episodes if returns is not None else 0,
        rollout_adapt_steps=settings.rollout_adapt_steps if returns is not None else 0,
        task_ids=tuple(task_ids),
        query_loss_per_task={steps: losses.tolist() for steps, losses in per_task.items()},
        trajectories=trajectories,
    )
    # One line: `offmeta run` prints the whole table once, after the run.
    logger.info("%s", report.summary())
    return report


Rollouts = Callable[
    [MetaLearner, Mapping[str, Any], list[dict[str, Any]], EvaluationConfig], dict[str, float]
]


def _point_robot_returns(
    learner: MetaLearner,
    meta_batch: Mapping[str, Any],
    tasks: list[dict[str, Any]],
    settings: EvaluationConfig,
) -> dict[str, float]:
    """Mean return per episode of each policy, ``rollout_episodes`` episodes per task."""
    (module,) = learner.config.data_modules  # the policy: the module that reads its own rows
    model = build_model(learner.config.modules[module]).to(learner.device)
    support = meta_batch["support"]
    adapted = [
        learner.adapt(None, task_slice(support, i), steps=settings.rollout_adapt_steps)[module]
        for i in range(len(tasks))
    ]
    episodes = settings.rollout_episodes
    per_episode = {
        name: torch.stack([a[name] for a in adapted]).repeat_interleave(episodes, dim=0)
        for name in adapted[0]
    }
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    dtype = next(iter(meta.values())).dtype
    goals = np.repeat(np.array([t["goal"] for t in tasks], dtype=np.float64), episodes, axis=0)

    def act(params: Mapping[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, dict(params), (obs,))
        return out["mean"] if isinstance(out, dict) else out

    one_row = vmap(lambda params, obs: act(params, obs[None])[0])

    def run(policy: Callable[[torch.Tensor], torch.Tensor]) -> float:
        def numpy_policy(obs: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                inputs = torch.from_numpy(obs).to(device=learner.device, dtype=dtype)
                return policy(inputs).cpu().numpy()

        return float(rollout_returns(numpy_policy, goals, seed=settings.seed).mean())

    expert_rng = np.random.default_rng(settings.seed)
    expert = float(
        rollout_returns(
            lambda obs: expert_actions(obs, goals, expert_rng, noise_std=0.0, random_fraction=0.0),
            goals,
            seed=settings.seed,
        ).mean()
    )
    return {
        "unadapted": run(lambda obs: act(meta, obs)),
        "adapted": run(lambda obs: one_row(per_episode, obs)),
        "expert": expert,
    }


_ENVIRONMENTS: dict[str, Rollouts] = {"point_robot": _point_robot_returns}
"""Generator name (``dataset.json`` ``generator.name``) -> its evaluation rollouts."""


def _behavior_return(rewards: np.ndarray, episodes: int) -> float:
    """Mean undiscounted episode return of the data: every reward counted once."""
    return float(np.asarray(rewards, dtype=np.float64).sum() / episodes)
