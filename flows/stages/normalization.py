"""``data.normalize``: the learner's config with the training data's statistics.

Validation gathers them (``pipeline.contract.value_checks``, ``DatasetInfo.values.stats``);
here they go where the learner applies them, so the learner state published with a version
carries them to every consumer:

- ``obs``: each observing module's ``input_stats`` (``learners.models.spec.InputStats``), so
  the network standardises its observations itself (``learners.models.factory.Standardize``),
  whatever it is run on (``new_obs`` too); a module whose input concatenates columns (the
  context encoder, the task model) standardises its observation parts with them as well;
- ``data.ignore_obs_features``: the same ``input_stats`` (mean 0, std 1 where the
  observations are not standardised) with those features ``ignored``, read as 0 by the
  observing modules and in the observation parts of a composed input, standardised or not;
- ``rewards``, ``returns``: ``column_stats``, which the learner applies to every batch that
  enters it (``learners.inner.rule.InnerRule.expand``) before a loss or an encoder reads them.
"""

from __future__ import annotations

import math

from flows.config import MetaTrainConfig
from learners.config import MetaConfig, ModuleSpec
from learners.models.spec import InputStats
from pipeline.contract.feature_stats import FeatureStats
from pipeline.reads.episodes import DatasetInfo

_OBSERVATIONS = ("obs", "new_obs")
"""Columns standardised with the observations' statistics."""
_COLUMNS = ("rewards", "returns")
"""Columns the learner standardises in its batches (``MetaConfig.column_stats``)."""


def learner_config(cfg: MetaTrainConfig, train: DatasetInfo) -> MetaConfig:
    """``cfg.learners.meta_config()`` with ``train``'s statistics of the columns
    ``data.normalize`` names and the observation features ``data.ignore_obs_features``
    names (unchanged when it names none)."""
    config = cfg.learners.meta_config()
    normalize, found = cfg.data.normalize, train.values.stats
    ignored = tuple(cfg.data.ignore_obs_features)
    column_stats = {c: _input_stats(found[c]) for c in _COLUMNS if c in normalize}
    obs = _input_stats(found["obs"]) if "obs" in normalize else None
    modules = dict(config.modules)
    if obs is not None or ignored:
        for module_id in config.observing_modules:
            spec = modules[module_id]
            width = math.prod(spec.observation_shape)
            modules[module_id] = _with_stats(spec, _observed(obs, width, ignored, module_id))
        for module_id, composed in config.composed_inputs.items():
            standardized = obs if composed.standardized else None
            if standardized is not None or ignored:
                stats = _concatenated(composed.parts, standardized, ignored, module_id)
                modules[module_id] = _with_stats(modules[module_id], stats)
    if modules == config.modules and not column_stats:
        return config
    return config.model_copy(update={"modules": modules, "column_stats": column_stats})


def _input_stats(found: FeatureStats) -> InputStats:
    return InputStats(mean=found.mean, std=found.std)


def _with_stats(spec: ModuleSpec, stats: InputStats) -> ModuleSpec:
    return spec.model_copy(update={"input_stats": stats})


def _observed(
    obs: InputStats | None, width: int, ignored: tuple[int, ...], module_id: str
) -> InputStats:
    """One observation's statistics (``obs``, or mean 0 and std 1 when it is read raw)
    with the ``ignored`` features."""
    outside = [i for i in ignored if i >= width]
    if outside:
        raise ValueError(
            f"data.ignore_obs_features: feature {max(outside)} is outside module "
            f"{module_id!r}'s observation of {width} features"
        )
    mean = obs.mean if obs is not None else (0.0,) * width
    std = obs.std if obs is not None else (1.0,) * width
    return InputStats(mean=mean, std=std, ignored=ignored)


def _concatenated(
    parts: tuple[tuple[str, int], ...],
    obs: InputStats | None,
    ignored: tuple[int, ...],
    module_id: str,
) -> InputStats:
    """Statistics of columns concatenated: the observations' for observation parts when
    ``obs`` is given (standardised), and mean 0, std 1 for the others (actions are not
    standardised; rewards and returns already are, in the batch, when ``data.normalize``
    names them); the ``ignored`` features of every observation part."""
    mean: list[float] = []
    std: list[float] = []
    dropped: list[int] = []
    for column, width in parts:
        if column in _OBSERVATIONS:
            part = _observed(obs, width, ignored, module_id)
            dropped += [len(mean) + i for i in part.ignored]
            mean += part.mean
            std += part.std
        else:
            mean += [0.0] * width
            std += [1.0] * width
    return InputStats(mean=mean, std=std, ignored=tuple(dropped))
