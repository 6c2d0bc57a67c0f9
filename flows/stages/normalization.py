"""``data.normalize``: the learner's config with the training data's statistics.

Validation gathers them (``pipeline.contract.value_checks``, ``DatasetInfo.values.stats``);
here they go where the learner applies them, so the learner state published with a version
carries them to every consumer:

- ``obs``: each observing module's ``input_stats`` (``learners.models.spec.InputStats``), so
  the network standardises its observations itself (``learners.models.factory.Standardize``),
  whatever it is run on (``new_obs`` too); a module whose input concatenates columns (the
  context encoder, the task model) standardises its observation parts with them as well;
- ``rewards``, ``returns``: ``column_stats``, which the learner applies to every batch that
  enters it (``learners.inner.rule.InnerRule.expand``) before a loss or an encoder reads them.
"""

from __future__ import annotations

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
    ``data.normalize`` names (unchanged when it names none)."""
    config = cfg.learners.meta_config()
    normalize, found = cfg.data.normalize, train.values.stats
    column_stats = {c: _input_stats(found[c]) for c in _COLUMNS if c in normalize}
    modules = dict(config.modules)
    if "obs" in normalize:
        obs = _input_stats(found["obs"])
        for module_id in config.observing_modules:
            modules[module_id] = _with_stats(modules[module_id], obs)
        for module_id, parts in config.composed_inputs.items():
            modules[module_id] = _with_stats(modules[module_id], _concatenated(parts, obs))
    if modules == config.modules and not column_stats:
        return config
    return config.model_copy(update={"modules": modules, "column_stats": column_stats})


def _input_stats(found: FeatureStats) -> InputStats:
    return InputStats(mean=found.mean, std=found.std)


def _with_stats(spec: ModuleSpec, stats: InputStats) -> ModuleSpec:
    return spec.model_copy(update={"input_stats": stats})


def _concatenated(parts: tuple[tuple[str, int], ...], obs: InputStats) -> InputStats:
    """Statistics of columns concatenated: the observations' for observation parts, and
    mean 0, std 1 for the others (actions are not standardised; rewards and returns already
    are, in the batch, when ``data.normalize`` names them)."""
    mean: list[float] = []
    std: list[float] = []
    for column, width in parts:
        observed = column in _OBSERVATIONS
        mean += obs.mean if observed else [0.0] * width
        std += obs.std if observed else [1.0] * width
    return InputStats(mean=mean, std=std)
