"""A published learner in one call: what a job that only uses the results needs.

A version that ``offmeta run`` publishes holds, beside its parameters, the learner's whole
state (config, meta-parameters, learned inner learning rates, optimizer) as the two files
``learner_state_files`` makes. ``load_learner`` rebuilds the ``learners.MetaLearner`` from them,
verified against the manifest's digests; then

- ``learner.adapt(None, support)`` adapts the meta-parameters to a new task's support set
  ``{module_id: {"obs": [K, obs_dim], "actions": [K, action_dim]}}`` with the inner rule and
  steps of training, and
- ``predict(learner, obs, params=adapted)`` runs a module on ``obs`` ``[B, obs_dim]`` (or
  ``[B, *obs_shape]``)
  (``params=None``: the meta-parameters, i.e. before adaptation).

Imports neither Ray nor Prefect (a test checks), so a consumer needs neither.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torch.func import functional_call

from learners.config import DEFAULT_MODULE_ID
from learners.meta.learner import MetaLearner
from learners.models.factory import build_model
from learners.params import Params
from pipeline.artifacts import ArtifactNotFoundError, ArtifactStore
from pipeline.io.checkpoints import dump_state, parse_state

LEARNER_TENSORS = "learner_state.safetensors"
LEARNER_JSON = "learner_state.json"


def learner_state_files(state: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """The files that let ``load_learner`` rebuild a learner from its ``get_state()``: pass
    them to ``ArtifactStore.publish(files=...)``."""
    tensor_bytes, json_bytes = dump_state(state)
    return [(LEARNER_TENSORS, tensor_bytes), (LEARNER_JSON, json_bytes)]


def load_learner(
    spec: str,
    *,
    root: str | os.PathLike[str] = "artifacts",
    device: str | torch.device = "cpu",
) -> MetaLearner:
    """The learner published as ``spec`` (``"name"``, ``"name:17"``, ``"name@alias"``) in the
    store at ``root`` (a path or ``file://`` URI), on ``device``.

    Every byte read is checked against the manifest (IntegrityError otherwise). Loading leaves
    the caller's torch random state as it was.
    """
    store = ArtifactStore(root)
    manifest = store.get(spec)
    missing = [name for name in (LEARNER_TENSORS, LEARNER_JSON) if name not in manifest.files]
    if missing:
        raise ArtifactNotFoundError(
            f"{manifest.spec} in {store.root} holds no learner state (no {', '.join(missing)}; "
            f"files: {', '.join(sorted(manifest.files))}); it was not published with "
            "learner_state_files(...): load its parameters with ArtifactStore.load_params"
        )
    return learner_from_files(
        store.read_file(manifest, LEARNER_TENSORS),
        store.read_file(manifest, LEARNER_JSON),
        where=f"{manifest.spec} learner state",
        device=device,
    )


def learner_from_files(
    tensor_bytes: bytes, json_bytes: bytes, *, where: str, device: str | torch.device = "cpu"
) -> MetaLearner:
    """The learner in the two ``learner_state_files`` (already verified by the caller), on
    ``device``; ``where`` names them in errors. The caller's torch random state is kept."""
    state = parse_state(tensor_bytes, json_bytes, where=where)
    device = torch.device(device)
    # set_state restores the training run's random state, which is no business of the caller.
    cuda = [device.index if device.index is not None else 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        return MetaLearner.from_state(state, device=device)


def predict(
    learner: MetaLearner,
    obs: Tensor,
    *,
    module_id: str = DEFAULT_MODULE_ID,
    params: Params | None = None,
) -> Tensor | dict[str, Tensor]:
    """Module ``module_id``'s output for ``obs`` (``[B, obs_dim]`` or ``[B, *obs_shape]``),
    without gradients.

    ``params`` are parameters from ``learner.adapt``; None means the meta-parameters. ``obs``
    is moved to the learner's device and dtype. The output is what the module's head gives:
    a tensor ``[B, action_dim]`` (actions, regression targets or logits), or for a gaussian
    head ``{"mean": ..., "log_std": ...}``.
    """
    modules = learner.config.modules
    if module_id not in modules:
        raise KeyError(f"module {module_id!r} is not one of the learner's modules {list(modules)}")
    chosen = learner.meta_params if params is None else params
    if module_id not in chosen:
        raise KeyError(
            f"params hold no module {module_id!r} (they hold {list(chosen)}); pass the result "
            "of learner.adapt(...) or None for the meta-parameters"
        )
    weights = chosen[module_id]
    shape = modules[module_id].observation_shape
    if len(shape) > 1:  # images and other shaped observations, flat or not, as in training
        obs = obs.reshape(obs.shape[0], *shape)
    reference = next(iter(learner.meta_params[module_id].values()))
    # The network's structure only: every parameter comes from `weights`, so it is built on
    # the meta device (no memory, no draw from the random generator).
    with torch.device("meta"):
        model = build_model(modules[module_id], module_id=module_id)
    with torch.no_grad():
        return functional_call(
            model, weights, (obs.to(device=reference.device, dtype=reference.dtype),)
        )
