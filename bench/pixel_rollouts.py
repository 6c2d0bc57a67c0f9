"""Held-out rollouts of a trained learner in the pixel point-robot environment, for
``bench/pixels.py``: each task's policy adapts on one support sample of that task (the
training inner rule), then every policy acts in ``make_env`` environments stepped in
lockstep, one batch of observations per step through finalize, as training saw them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch.func import functional_call, vmap

from learners.meta.learner import MetaLearner
from learners.meta.meta_batch import task_slice
from learners.models.mlp import build_model
from pipeline.reads.episodes import Episodes
from pipeline.streams.collate import finalize
from pipeline.synthetic.point_robot import EPISODE_STEPS, expert_actions
from pipeline.synthetic.point_robot_pixels_env import make_env
from pipeline.tasks.samples import task_samples

Policy = Callable[[torch.Tensor], torch.Tensor]


def heldout_rollouts(
    cfg: Any, learner_state: Mapping[str, Any], heldout: Episodes
) -> dict[str, float]:
    """Mean return and success rate of the unadapted and adapted policies, and the mean
    return of the noise-free expert, over ``evaluation.rollout_episodes`` episodes of each
    of ``evaluation.tasks`` held-out tasks."""
    settings = cfg.evaluation
    learner = MetaLearner.from_state(learner_state, device=cfg.training.device)
    samples = task_samples(heldout, support=cfg.tasks.support, query=cfg.tasks.query)
    meta_batch, task_ids = samples.one_per_task(settings.tasks, seed=settings.seed)
    layout = heldout.schema.obs_layout
    support = finalize(meta_batch, learner.device, obs_layout=layout)["support"]
    (module,) = learner.config.data_modules
    adapted = [
        learner.adapt(None, task_slice(support, i), steps=settings.rollout_adapt_steps)[module]
        for i in range(len(task_ids))
    ]
    episodes = settings.rollout_episodes
    per_episode = {
        name: torch.stack([a[name] for a in adapted]).repeat_interleave(episodes, dim=0)
        for name in adapted[0]
    }
    meta = {name: p.detach() for name, p in learner.meta_params[module].items()}
    model = build_model(learner.config.modules[module]).to(learner.device)

    def act(params: Mapping[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
        # The MLP reads images flattened per row, as the losses hand them to it.
        return functional_call(model, dict(params), (obs.reshape(obs.shape[0], -1),))

    one_row = vmap(lambda params, obs: act(params, obs[None])[0])
    generator = heldout.metadata["generator"]["args"]
    camera = {key: generator[key] for key in ("image_size", "blob_sigma", "layout")}
    tasks = [heldout.metadata["tasks"][task_id] for task_id in task_ids]

    goals = np.repeat(np.array([t["goal"] for t in tasks]), episodes, axis=0)

    def run(policy: Policy | None) -> tuple[float, float]:
        envs = [
            make_env(task_id, params, **camera)
            for task_id, params in zip(task_ids, tasks, strict=True)
            for _ in range(episodes)
        ]
        return _lockstep(envs, policy, goals, learner.device, layout, settings.seed)

    unadapted, success_unadapted = run(lambda obs: act(meta, obs))
    adapted_return, success_adapted = run(lambda obs: one_row(per_episode, obs))
    expert, _ = run(None)
    return {
        "adapted": adapted_return,
        "unadapted": unadapted,
        "expert": expert,
        "success_adapted": success_adapted,
        "success_unadapted": success_unadapted,
    }


def _lockstep(
    envs: list[Any],
    policy: Policy | None,
    goals: np.ndarray,
    device: torch.device,
    layout: str | None,
    seed: int,
) -> tuple[float, float]:
    """Mean return and success rate of one episode per env; ``policy=None`` plays the
    noise-free expert towards ``goals`` from the positions the envs report."""
    starts = [env.reset(seed=seed * 100_003 + i) for i, env in enumerate(envs)]
    obs = np.stack([o for o, _ in starts])
    positions = np.array([info["position"] for _, info in starts])
    returns = np.zeros(len(envs))
    successes = np.zeros(len(envs), dtype=bool)
    rng = np.random.default_rng(seed)
    for _ in range(EPISODE_STEPS):
        if policy is None:
            actions = expert_actions(positions, goals, rng, noise_std=0.0, random_fraction=0.0)
        else:
            images = finalize({"m": {"obs": torch.from_numpy(obs)}}, device, obs_layout=layout)
            with torch.no_grad():
                actions = policy(images["m"]["obs"]).cpu().numpy()
        steps = [env.step(action) for env, action in zip(envs, actions, strict=True)]
        obs = np.stack([s[0] for s in steps])
        returns += [s[1] for s in steps]
        positions = np.array([s[4]["position"] for s in steps])
        successes |= [bool(s[4].get("is_success", False)) for s in steps]
    return float(returns.mean()), float(successes.mean())
