"""Episodes of the meta-policy in the held-out tasks' Gymnasium environments.

``roll_out`` runs one episode in each environment it is given, all at once: every step, one
batched policy call acts for all the episodes still running, then each of their environments
steps. Episode starts are reproducible: one generator seeded with ``seed`` becomes every
environment's ``np_random`` and the environments are reset in order, so a policy rolled out
again (another policy, the same seed) starts from the same states.

``PolicyActions`` turns the policy network into such a batched policy: the meta-parameters
for every episode (unadapted), or each episode's own task-adapted parameters, vmapped
(adapted); actions are the head's mean (continuous) or the argmax of its logits (discrete),
or samples from the head with ``sample``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from pipeline.contract.schema import ObservationLayout
from pipeline.streams.collate import finalize


class Observed(NamedTuple):
    """What a policy sees at one step of the episodes still running."""

    obs: np.ndarray
    """``[n, *obs_shape]``, the episodes' observations stacked."""
    rows: np.ndarray
    """``[n]`` which episodes (positions in ``roll_out``'s ``envs``) they are."""
    infos: list[dict[str, Any]]
    """Each episode's last ``info`` (from reset or step)."""


Policy = Callable[[Observed], np.ndarray]
"""``Observed -> actions [n, ...]``, one action per running episode."""


class RolloutResult(NamedTuple):
    """One episode per environment, in the order of ``roll_out``'s ``envs``."""

    returns: np.ndarray
    """``[N]`` float64 undiscounted returns."""
    lengths: np.ndarray
    """``[N]`` steps taken."""
    successes: np.ndarray | None
    """``[N]`` bool: ``info["success"]`` (or ``"is_success"``) true at any step; None when no
    environment reported either."""
    final_successes: np.ndarray | None
    """``[N]`` bool: the success reported after the episode's last step (a manipulation that
    must still hold at the end); None when ``successes`` is."""
    positions: list[np.ndarray] | None
    """Per episode ``[steps + 1, 2]``: ``info["position"]`` at reset and after each step;
    None unless every environment reports one."""
    goals: np.ndarray | None
    """``[N, 2]`` ``info["goal"]`` at reset, when every environment reports one (marked in
    the rollout picture)."""


def roll_out(
    envs: Sequence[gym.Env], policy: Policy, *, seed: int | np.random.Generator, max_steps: int
) -> RolloutResult:
    """One episode of ``policy`` in each of ``envs`` (see the module docstring); episodes
    still running after ``max_steps`` steps are cut there. A generator as ``seed`` is used as
    it is, so episodes rolled out one batch after another draw on from where the last
    batch stopped."""
    rng = np.random.default_rng(seed)
    obs, infos = [], []
    for env in envs:
        env.np_random = rng
        first, info = env.reset()
        obs.append(first)
        infos.append(info)
    infos_at_reset = list(infos)
    n = len(envs)
    returns = np.zeros(n)
    lengths = np.zeros(n, dtype=np.int64)
    successes = np.zeros(n, dtype=bool)
    final_successes = np.zeros(n, dtype=bool)
    reported = False
    tracked = all("position" in info for info in infos)
    positions = [[np.asarray(info["position"])] for info in infos] if tracked else None
    running = np.ones(n, dtype=bool)
    for _ in range(max_steps):
        rows = np.flatnonzero(running)
        if len(rows) == 0:
            break
        actions = policy(Observed(np.stack([obs[r] for r in rows]), rows, [infos[r] for r in rows]))
        for row, action in zip(rows, actions, strict=True):
            obs[row], reward, terminated, truncated, infos[row] = envs[row].step(action)
            returns[row] += float(reward)
            lengths[row] += 1
            success = infos[row].get("success", infos[row].get("is_success"))
            if success is not None:
                reported = True
                successes[row] |= bool(success)
                final_successes[row] = bool(success)
            if positions is not None:
                positions[row].append(np.asarray(infos[row]["position"]))
            running[row] = not (terminated or truncated)
    return RolloutResult(
        returns=returns,
        lengths=lengths,
        successes=successes if reported else None,
        final_successes=final_successes if reported else None,
        positions=None if positions is None else [np.stack(p) for p in positions],
        goals=np.stack([info["goal"] for info in infos_at_reset])
        if all("goal" in info for info in infos_at_reset)
        else None,
    )


def expert_policy(observed: Observed) -> np.ndarray:
    """The environments' own reference policy: each one's ``info["expert_action"]``."""
    return np.stack([np.asarray(info["expert_action"]) for info in observed.infos])


def reports_expert(env: gym.Env) -> bool:
    """Whether ``env`` reports ``info["expert_action"]`` (looked at on a reset from a
    throwaway generator: the rollouts reseed it)."""
    env.np_random = np.random.default_rng(0)
    return "expert_action" in env.reset()[1]


@dataclass(frozen=True)
class PolicyActions:
    """The policy network of a module with given parameters, as ``roll_out`` policies."""

    model: nn.Module
    action_space: gym.Space
    sample: bool
    generator: torch.Generator
    """Draws of ``sample``."""
    obs_layout: ObservationLayout | None = None
    """Axis order of uint8 image observations (``CHW`` when None): they become float in
    ``[0, 1]``, channels first, as in the training batches."""

    def __post_init__(self) -> None:
        if not isinstance(self.action_space, gym.spaces.Box | gym.spaces.Discrete):
            raise ValueError(
                f"evaluation rollouts act in Box or Discrete action spaces; the environment's "
                f"is {self.action_space}"
            )

    def shared(self, params: Mapping[str, Tensor]) -> Policy:
        """The same ``params`` for every episode (the unadapted meta-policy)."""

        def policy(observed: Observed) -> np.ndarray:
            with torch.no_grad():
                inputs = self._inputs(observed, params)
                return self._act(functional_call(self.model, dict(params), (inputs,)))

        return policy

    def per_episode(self, params: Mapping[str, Tensor]) -> Policy:
        """Episode ``i`` acts with ``{name: p[i]}`` of ``params`` (adapted to its task)."""
        one_row = vmap(lambda p, obs: _first(functional_call(self.model, p, (obs[None],))))

        def policy(observed: Observed) -> np.ndarray:
            with torch.no_grad():
                rows = torch.from_numpy(observed.rows).to(next(iter(params.values())).device)
                chosen = {name: p[rows] for name, p in params.items()}
                return self._act(one_row(chosen, self._inputs(observed, params)))

        return policy

    def _inputs(self, observed: Observed, params: Mapping[str, Tensor]) -> Tensor:
        like = next(iter(params.values()))
        obs = torch.from_numpy(np.asarray(observed.obs))
        if obs.dtype == torch.uint8:
            obs = finalize({"obs": obs}, like.device, obs_layout=self.obs_layout)["obs"]
        return obs.to(device=like.device, dtype=like.dtype)

    def _act(self, outputs: Tensor | Mapping[str, Tensor]) -> np.ndarray:
        if isinstance(self.action_space, gym.spaces.Discrete):
            logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs
            if not self.sample:
                return logits.argmax(dim=-1).cpu().numpy()
            probs = torch.softmax(logits.float(), dim=-1)
            return torch.multinomial(probs, 1, generator=self.generator)[:, 0].cpu().numpy()
        mean = outputs["mean"] if isinstance(outputs, Mapping) else outputs
        if self.sample and isinstance(outputs, Mapping) and "log_std" in outputs:
            # A head without a distribution (deterministic, mean_advantage) acts on its mean.
            noise = torch.randn(
                mean.shape, generator=self.generator, device=mean.device, dtype=mean.dtype
            )
            mean = mean + outputs["log_std"].exp() * noise
        return mean.cpu().numpy()


def _first(outputs: Tensor | Mapping[str, Tensor]) -> Tensor | dict[str, Tensor]:
    """Row 0 of a one-row forward (a tensor or a dict of them)."""
    if isinstance(outputs, Mapping):
        return {name: value[0] for name, value in outputs.items()}
    return outputs[0]
