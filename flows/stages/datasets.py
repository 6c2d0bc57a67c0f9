"""Stage 1 of a run: read both datasets, refuse them before training if they do not fit the
config or each other.

``inspect_datasets`` runs every check without Ray (``offmeta run`` calls it before starting
Ray or Prefect); ``validate_datasets`` runs the same checks on the Ray reads the run uses.
Beyond the layout and the modules, the checks include what task sampling and evaluation
would refuse later (``flows.stages.task_checks``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from flows.config import MetaTrainConfig
from flows.stages.task_checks import check_task_sampling
from learners.models.spec import ModuleSpec
from pipeline.contract.schema import REQUIRED_COLUMNS, DatasetError
from pipeline.reads.episodes import DatasetInfo, Episodes, inspect_episodes, read_episodes
from pipeline.reads.selection import EpisodeCondition, EpisodeFilter


@dataclass(frozen=True)
class Datasets:
    """The validated train and held-out episodes of a run."""

    train: Episodes
    heldout: Episodes

    def summary(self) -> dict[str, Any]:
        """Plain JSON for logs and lineage."""
        return {"train": self.train.summary(), "heldout": self.heldout.summary()}


def validate_datasets(cfg: MetaTrainConfig) -> Datasets:
    """Read and check ``cfg.data.train`` and ``cfg.data.heldout``.

    Beyond ``read_episodes``'s own checks: both datasets have the same observation and
    action layout, every module the learner trains is in both, with the sizes its
    ``learners.modules`` entry declares, and their tasks fit ``cfg.tasks`` and
    ``cfg.evaluation`` (``flows.stages.task_checks``). Raises ``DatasetError`` naming the
    dataset, the config field, what was found and what was expected.
    """
    found = _inspected.get(_memo_key(cfg))
    if found is not None and all(map(_unchanged, found)):
        train = read_episodes(
            cfg.data.train, **_read_options(cfg, "train"), validated=found[0].info
        )
        heldout = read_episodes(
            cfg.data.heldout, **_read_options(cfg, "heldout"), validated=found[1].info
        )
        return Datasets(train=train, heldout=heldout)
    train = read_episodes(cfg.data.train, **_read_options(cfg, "train"))
    heldout = read_episodes(cfg.data.heldout, **_read_options(cfg, "heldout"))
    _check_fit(cfg, train, heldout)
    return Datasets(train=train, heldout=heldout)


def inspect_datasets(cfg: MetaTrainConfig) -> tuple[DatasetInfo, DatasetInfo]:
    """``validate_datasets``'s checks without Ray: ``(train, heldout)`` described by
    ``inspect_episodes`` (the checks ``offmeta data validate`` runs), or ``DatasetError``
    with the message ``validate_datasets`` would raise."""
    train = inspect_episodes(cfg.data.train, **_read_options(cfg, "train"))
    heldout = inspect_episodes(cfg.data.heldout, **_read_options(cfg, "heldout"))
    _check_fit(cfg, train, heldout)
    _inspected.clear()
    _inspected[_memo_key(cfg)] = (_inspected_now(train), _inspected_now(heldout))
    return train, heldout


class _Inspected(NamedTuple):
    """A dataset as ``inspect_datasets`` found it, with each file's size and modification
    time then, to tell whether it is still the same when the run reads it."""

    info: DatasetInfo
    stats: tuple[tuple[int, int | None], ...]


_inspected: dict[str, tuple[_Inspected, _Inspected]] = {}
"""The last ``inspect_datasets`` of this process (``offmeta run`` checks the data before
the flow starts): ``validate_datasets`` of the same run config reuses it, while no file
changed, instead of reading every file a second time seconds later."""


def _memo_key(cfg: MetaTrainConfig) -> str:
    # The whole config: the fit checks inspect_datasets ran read tasks and learners too.
    return cfg.model_dump_json()


def _inspected_now(info: DatasetInfo) -> _Inspected:
    return _Inspected(info, _file_stats(info))


def _file_stats(info: DatasetInfo) -> tuple[tuple[int, int | None], ...]:
    return tuple((f.size, f.mtime_ns) for f in info.filesystem.get_file_info(list(info.files)))


def _unchanged(inspected: _Inspected) -> bool:
    return _file_stats(inspected.info) == inspected.stats


def value_warnings(*datasets: DatasetInfo) -> list[str]:
    """What the value checks counted but did not refuse (float actions outside a declared
    box), one line per dataset that has any, for the caller to show."""
    return [info.values.warning for info in datasets if info.values.warning]


def _read_options(cfg: MetaTrainConfig, split: str) -> dict[str, Any]:
    """The ``data`` settings every read of a run's ``split`` dataset takes."""
    return {
        "column_map": cfg.data.column_map or None,
        "allow_partial_episodes": cfg.data.allow_partial_episodes,
        "check_values": cfg.data.check_values,
        "validation_memory_mb": cfg.data.validation_memory_mb,
        "episodes_where": episode_filter(cfg, split),
        "normalize": tuple(cfg.data.normalize) if split == "train" else (),
        "gamma": cfg.data.gamma,
    }


def episode_filter(cfg: MetaTrainConfig, split: str) -> EpisodeFilter | None:
    """``data.episodes_where.<split>`` in the words of ``pipeline.reads.selection``;
    ``None`` when it keeps every episode."""
    conditions = getattr(cfg.data.episodes_where, split)
    if not conditions:
        return None
    return EpisodeFilter(
        tuple(EpisodeCondition(*condition.as_condition()) for condition in conditions),
        label=f"data.episodes_where.{split}",
    )


def _check_fit(cfg: MetaTrainConfig, train: DatasetInfo, heldout: DatasetInfo) -> None:
    _check_same_layout(train, heldout)
    for split, episodes in (("train", train), ("heldout", heldout)):
        _check_modules(cfg, split, episodes)
    check_task_sampling(cfg, train, heldout)


def _check_same_layout(train: DatasetInfo, heldout: DatasetInfo) -> None:
    for field in ("obs_shape", "action_shape", "discrete_actions"):
        found, expected = getattr(heldout.schema, field), getattr(train.schema, field)
        if found != expected:
            raise DatasetError(
                f"held-out dataset {heldout.root}: {field} is {_shown(found)} but the train "
                f"dataset {train.root} has {_shown(expected)}; expected held-out tasks of the "
                "same task family (data.heldout must match data.train)"
            )


def _check_modules(cfg: MetaTrainConfig, split: str, episodes: DatasetInfo) -> None:
    learners = cfg.learners
    where = f"{split} dataset {episodes.root}"
    derived = ("returns", "returns_truncated")  # every task sample gets them (data.gamma)
    present = {*REQUIRED_COLUMNS, *derived, *(("new_obs",) if episodes.schema.has_new_obs else ())}
    missing = [name for name in learners.sample_columns if name not in present]
    if missing:
        raise DatasetError(
            f"{where} has no column {missing[0]!r}, which algorithm {learners.algorithm!r} "
            f"reads from every task sample (it reads {list(learners.sample_columns)})"
        )
    observing = learners.observing_modules
    for module_id in learners.trained_modules:
        if learners.modules[module_id].data_module is not None and module_id in observing:
            # Reads another module's rows (checked below with it) and has outputs of its own.
            _check_observations(where, episodes, module_id, learners.modules[module_id])
    for module_id in learners.data_modules:
        if module_id not in episodes.module_ids:
            raise DatasetError(
                f"{where} has no rows of module {module_id!r}, which learners.modules trains; "
                f"its modules are {list(episodes.module_ids)} (rename the module in the config, "
                "or list the ones to train in learners.modules_to_update)"
            )
        spec = learners.modules[module_id]
        _check_observations(where, episodes, module_id, spec)
        action_dim = _action_dim(episodes)
        if action_dim is not None and spec.action_dim != action_dim:
            what = (
                "discrete actions"
                if episodes.schema.discrete_actions
                else f"actions have shape {list(episodes.schema.action_shape)}"
            )
            raise DatasetError(
                f"{where}: {what} ({action_dim} outputs) but "
                f"learners.modules.{module_id}.action_dim is {spec.action_dim}; "
                f"expected action_dim: {action_dim}"
            )


def _check_observations(
    where: str, episodes: DatasetInfo, module_id: str, spec: ModuleSpec
) -> None:
    """The module's ``obs_dim`` holds one observation, and its ``obs_shape``, when given, is
    the shape finalize gives it (``[C, H, W]`` for images, whatever their stored layout)."""
    schema = episodes.schema
    obs_dim = math.prod(schema.obs_shape)
    if spec.obs_dim != obs_dim:
        raise DatasetError(
            f"{where}: observations have shape {list(schema.obs_shape)} "
            f"({obs_dim} values) but learners.modules.{module_id}.obs_dim is {spec.obs_dim}; "
            f"expected obs_dim: {obs_dim}"
        )
    seen = schema.module_obs_shape
    if spec.obs_shape is not None and tuple(spec.obs_shape) != seen:
        stored = (
            f"{schema.obs_layout} images stored as {list(schema.obs_shape)} reach the module as "
            f"{list(seen)}"
            if schema.obs_layout is not None
            else f"observations have shape {list(seen)}"
        )
        raise DatasetError(
            f"{where}: {stored} but learners.modules.{module_id}.obs_shape is "
            f"{list(spec.obs_shape)}; expected obs_shape: {list(seen)}"
        )


def _action_dim(episodes: DatasetInfo) -> int | None:
    """Outputs a module needs: action size, or the number of discrete actions when
    ``dataset.json`` says it (unknown otherwise)."""
    if not episodes.schema.discrete_actions:
        return math.prod(episodes.schema.action_shape)
    space = episodes.metadata.get("action_space") or {}
    return space.get("n")


def _shown(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
