"""Tiny point-robot datasets and run configs for the flow tests (a run takes seconds)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from flows.config import MetaTrainConfig, apply_override, validate_config
from pipeline.synthetic import PointRobotTasks, generate

if TYPE_CHECKING:
    from pipeline.artifacts import ArtifactStore, Manifest


@dataclass(frozen=True)
class FirstRun:
    """A finished ``offmeta run`` of the tiny config: its data, work directory, output and
    published version."""

    data: Path
    work: Path
    stdout: str
    manifest: Manifest
    store: ArtifactStore


def tiny_point_robot(root: Path) -> Path:
    """12 train goals and 4 held-out goals, one 20-step episode each; returns ``root``."""
    generate(PointRobotTasks(episodes_per_task=1), root, tasks=12, heldout_tasks=4, seed=0)
    return root


def tiny_document(data: Path, work: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A run config as parsed YAML: 12 iterations, checkpoints every 4, 2-step rollouts."""
    document: dict[str, Any] = {
        "data": {"train": str(data / "train"), "heldout": str(data / "heldout")},
        "tasks": {"support": 5, "query": 5, "meta_batch": 4, "seed": 0},
        "learners": {
            "modules": {
                "default_policy": {
                    "obs_dim": 2,
                    "action_dim": 2,
                    "model": {"hidden_sizes": [8, 8]},
                }
            },
            "inner": {"lr": 0.5},
        },
        "training": {
            "iterations": 12,
            "log_every": 4,
            "checkpoint_every": 4,
            "checkpoint_dir": str(work / "runs"),
            "retries": 1,
            "retry_delay_s": 0,
        },
        "evaluation": {"tasks": 4, "rollout_episodes": 2, "rollout_adapt_steps": 2},
        "artifacts": {"root": str(work / "artifacts"), "name": "tiny-robot"},
    }
    for override in overrides:
        apply_override(document, override)
    return document


EPISODE_CONTEXT = (
    "tasks.support_from=episodes",
    "tasks.query=10",
    "tasks.meta_batch=3",
    "training.iterations=3",
    "training.checkpoint_every=3",
    "evaluation.tasks=3",
    "evaluation.rollout_episodes=1",
    "evaluation.rollout_adapt_steps=1",
    "evaluation.steps=[0, 1]",
)
"""``tiny_document`` overrides for support sets of episodes: 3 meta-steps of 3 tasks, one
rollout of each of 3 held-out tasks (with data of 3 episodes per goal)."""


def online_context_learner(window: int) -> list[str]:
    """``tiny_document`` overrides for an untrained context learner on the point robot (a
    deterministic head, an encoder of 7-8-8 that reads rewards) whose held-out context is
    collected online, ``window`` steps of each exploration episode."""
    return [
        "learners.algorithm=context",
        "learners.modules.default_policy.model.head=deterministic",
        "learners.modules.encoder={obs_dim: 7, action_dim: 8, model: {hidden_sizes: [8]}}",
        "tasks.support_from=episodes",
        f"tasks.support_window={window}",
        "evaluation.context=online",
    ]


def tiny_config(data: Path, work: Path, overrides: Sequence[str] = ()) -> MetaTrainConfig:
    return validate_config(tiny_document(data, work, overrides))


def write_config(path: Path, document: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
