"""Functional meta-learners in pure torch: parameter dicts, the differentiable inner learner,
the meta learner (MAML, first-order MAML, Meta-SGD), losses, models and the metrics logger.

Imports nothing from Ray, Prefect or `pipeline`; batches are plain dicts of tensors.

The names below are imported on first use (PEP 562), so that importing a light submodule
(``learners.config``, which ``flows.config`` reads) does not import torch: that takes 2-3 s,
which a run refused for its config should not pay.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, ...]] = {
    "learners.config": (
        "DEFAULT_MODULE_ID",
        "InnerConfig",
        "MetaConfig",
        "ModelConfig",
        "ModuleSpec",
        "OuterConfig",
    ),
    "learners.inner.differentiable": (
        "DifferentiableLearner",
        "NonFiniteGradientError",
        "UpdateResult",
    ),
    "learners.inner.optim": ("init_log_lrs", "inner_optimizer", "lrs_from_log"),
    "learners.losses": (
        "LOSSES",
        "LossFn",
        "ModuleCall",
        "cross_entropy_loss",
        "gaussian_nll_loss",
        "mse_loss",
        "resolve_loss",
    ),
    "learners.meta.learner": ("MetaGradients", "MetaLearner"),
    "learners.meta.meta_batch": ("MetaBatch", "check_meta_batch", "task_slice"),
    "learners.metrics": ("MetricsLogger", "merge_reduced"),
    "learners.models.factory": ("build_model", "build_models"),
    "learners.models.mlp": ("MLP", "GaussianMLP"),
    "learners.params": (
        "Batch",
        "Params",
        "buffers_from_modules",
        "detach_params",
        "params_from_modules",
    ),
    "learners.torch_compat": ("SUPPORTED_TORCH",),
    "learners.training.loop": ("HISTORY_METRICS", "History", "run_meta_training"),
    "learners.transforms": ("Transform", "chain", "global_norm"),
}
"""The submodule each public name lives in."""
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'learners' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
