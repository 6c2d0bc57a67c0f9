"""Functional meta-learners in pure torch: parameter dicts, the differentiable inner learner,
the meta learner (MAML, first-order MAML, Meta-SGD), losses, models and the metrics logger.

Imports nothing from Ray, Prefect or `pipeline`; batches are plain dicts of tensors.
"""

from learners.config import (
    DEFAULT_MODULE_ID,
    InnerConfig,
    MetaConfig,
    ModelConfig,
    ModuleSpec,
    OuterConfig,
)
from learners.inner.differentiable import (
    DifferentiableLearner,
    NonFiniteGradientError,
    UpdateResult,
)
from learners.inner.optim import init_log_lrs, inner_optimizer, lrs_from_log
from learners.losses import (
    LOSSES,
    LossFn,
    ModuleCall,
    cross_entropy_loss,
    gaussian_nll_loss,
    mse_loss,
    resolve_loss,
)
from learners.meta.learner import MetaGradients, MetaLearner
from learners.meta.meta_batch import MetaBatch, check_meta_batch, task_slice
from learners.metrics import MetricsLogger, merge_reduced
from learners.models.factory import build_model, build_models
from learners.models.mlp import MLP, GaussianMLP
from learners.params import (
    Batch,
    Params,
    buffers_from_modules,
    detach_params,
    params_from_modules,
)
from learners.torch_compat import SUPPORTED_TORCH
from learners.training.loop import HISTORY_METRICS, History, run_meta_training
from learners.transforms import Transform, chain, global_norm

__all__ = [
    "DEFAULT_MODULE_ID",
    "HISTORY_METRICS",
    "LOSSES",
    "MLP",
    "SUPPORTED_TORCH",
    "Batch",
    "DifferentiableLearner",
    "GaussianMLP",
    "History",
    "InnerConfig",
    "LossFn",
    "MetaBatch",
    "MetaConfig",
    "MetaGradients",
    "MetaLearner",
    "MetricsLogger",
    "ModelConfig",
    "ModuleCall",
    "ModuleSpec",
    "NonFiniteGradientError",
    "OuterConfig",
    "Params",
    "Transform",
    "UpdateResult",
    "buffers_from_modules",
    "build_model",
    "build_models",
    "chain",
    "check_meta_batch",
    "cross_entropy_loss",
    "detach_params",
    "gaussian_nll_loss",
    "global_norm",
    "init_log_lrs",
    "inner_optimizer",
    "lrs_from_log",
    "merge_reduced",
    "mse_loss",
    "params_from_modules",
    "resolve_loss",
    "run_meta_training",
    "task_slice",
]
