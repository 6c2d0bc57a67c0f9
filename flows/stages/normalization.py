"""``data.normalize``: the learner's config with the training data's input statistics.

Validation gathers them (``pipeline.contract.value_checks``, ``DatasetInfo.values.stats``);
here they become each module's ``input_stats`` (``learners.models.spec.InputStats``), so
the network standardises its observations itself (``learners.models.factory.Standardize``)
and the learner state published with a version carries them to every consumer.
"""

from __future__ import annotations

from flows.config import MetaTrainConfig
from learners.config import MetaConfig
from learners.models.spec import InputStats
from pipeline.reads.episodes import DatasetInfo


def learner_config(cfg: MetaTrainConfig, train: DatasetInfo) -> MetaConfig:
    """``cfg.learners.meta_config()``, each observing module's ``input_stats`` set from ``train``'s
    observation statistics when ``data.normalize`` names ``obs`` (unchanged otherwise)."""
    config = cfg.learners.meta_config()
    if "obs" not in cfg.data.normalize:
        return config
    found = train.values.stats["obs"]
    stats = InputStats(mean=found.mean, std=found.std)
    # The algorithm says which modules take them, and how: a context encoder reads whole
    # transitions, whose width is not the observation's.
    given = config.input_stats(stats)
    modules = {
        module_id: spec.model_copy(update={"input_stats": given[module_id]})
        if module_id in given
        else spec
        for module_id, spec in config.modules.items()
    }
    return config.model_copy(update={"modules": modules})
