"""``MetaTrainConfig``: the one typed config of a meta-training run, and how it is loaded.

A run's config comes from a YAML file in ``flows/configs/`` plus ``--set a.b.c=value``
overrides (values parsed as YAML, so ``--set training.iterations=500`` is an int and
``--set evaluation.steps=[0,1,3]`` a list). It is validated once, here, and stored with every
published artifact. The learner part reuses ``learners.config`` (``learners`` *is* a
``MetaConfig`` plus ``num_learners``), so ``--set learners.inner.lr=0.05`` reaches the inner
rule directly.

This module imports neither torch, Ray nor Prefect: the CLI validates a config before paying
for any of them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
    model_validator,
)

from flows.config_text import ConfigError, apply_override, format_errors, one_line
from learners.config import MetaConfig
from pipeline.artifacts.errors import ArtifactNameError, UnsupportedRootError
from pipeline.artifacts.records.names import validate_name
from pipeline.artifacts.records.roots import parse_root
from pipeline.contract.id_findings import VALIDATION_MEMORY_MB
from pipeline.contract.schema import CheckValues
from pipeline.tasks.obs_shift import ObsShift

_STRICT = ConfigDict(extra="forbid")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?|mps")


Scalar = str | int | float | bool


class EpisodeConditionConfig(BaseModel):
    """One condition of ``data.episodes_where``: a column and exactly one of ``in``,
    ``not_in`` or ``ever``, decided per episode over all of its rows (see
    pipeline.reads.selection and docs/selection.md)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    column: str = Field(
        description="Column the condition reads: a pass-through column (such as a "
        "behaviour label) as named on disk, or a canonical column by its canonical name."
    )
    in_: list[Scalar] | None = Field(
        None,
        alias="in",
        min_length=1,
        description="Keep an episode when every one of its rows holds one of these values.",
    )
    not_in: list[Scalar] | None = Field(
        None,
        min_length=1,
        description="Keep an episode when none of its rows holds one of these values.",
    )
    ever: Scalar | None = Field(
        None, description="Keep an episode when some row holds this value (ever: true)."
    )

    @model_validator(mode="after")
    def _one_test(self) -> EpisodeConditionConfig:
        chosen = [name for name in ("in_", "not_in", "ever") if name in self.model_fields_set]
        if len(chosen) != 1:
            raise ValueError(
                f"column {self.column!r}: expected exactly one of in, not_in, ever; got "
                f"{len(chosen)}"
            )
        return self

    @model_serializer(mode="wrap")
    def _its_one_test(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The column and the one test it was given, so that a dump (a run's recorded
        config, a Ray Train worker's) validates back as the same condition."""
        unset = [name for name in ("in_", "not_in", "ever") if name not in self.model_fields_set]
        keys = set(unset) | {type(self).model_fields[name].alias for name in unset}
        return {key: value for key, value in handler(self).items() if key not in keys}

    def as_condition(self) -> tuple[str, str, tuple[Any, ...]]:
        """``(column, kind, values)``, the words of ``pipeline.reads.selection``."""
        if "in_" in self.model_fields_set:
            return self.column, "in", tuple(self.in_ or ())
        if "not_in" in self.model_fields_set:
            return self.column, "not_in", tuple(self.not_in or ())
        return self.column, "ever", (self.ever,)


class EpisodesWhereConfig(BaseModel):
    """Which episodes each dataset keeps; every condition of a list must hold."""

    model_config = _STRICT

    train: list[EpisodeConditionConfig] = Field(
        default_factory=list,
        description="Conditions on the training episodes (empty: every episode is kept).",
    )
    heldout: list[EpisodeConditionConfig] = Field(
        default_factory=list,
        description="Conditions on the held-out episodes evaluation adapts on and scores "
        "(empty: every episode is kept).",
    )


NormalizedColumn = Literal["obs", "rewards", "returns"]
"""What ``data.normalize`` may name (docs/normalization.md)."""

ContextExplore = Literal["prior", "posterior", "refine", "library"]
"""Which policy explores a held-out task for ``evaluation.context: online``."""


class DataConfig(BaseModel):
    """Where the episodes are. Paths are relative to the working directory of the run."""

    model_config = _STRICT

    train: str = Field(description="Dataset the initialisation is meta-trained on.")
    heldout: str = Field(description="Dataset of unseen tasks the result is evaluated on.")
    column_map: dict[str, str] = Field(
        default_factory=dict,
        description="Canonical column -> column name on disk, for both datasets "
        "(e.g. {obs: observation}).",
    )
    gamma: float = Field(
        0.99,
        ge=0,
        le=1,
        description="Discount of the per-episode return-to-go derived at ingest (columns "
        "returns and returns_truncated of every task sample; see pipeline.reads.returns).",
    )
    allow_partial_episodes: bool = Field(
        False,
        description="Accept episodes that do not start at t 0, miss steps or carry an end "
        "flag before their last step (knowingly partial data; see docs/data-contract.md#episodes).",
    )
    check_values: CheckValues = Field(
        "full",
        description="How much of obs, new_obs, actions and rewards validation scans for NaN, "
        "inf and discrete actions outside dataset.json's action_space (refused), and float "
        "actions outside its box bounds (a warning): every row group (full), one row group "
        "in 16 (sample, for datasets whose full scan takes too long), or none (off). See "
        "pipeline.contract.value_checks.",
    )

    episodes_where: EpisodesWhereConfig = Field(
        default_factory=EpisodesWhereConfig,
        description="Keep only the episodes whose columns match, for training and for "
        "held-out evaluation separately, applied while reading and recorded in lineage "
        "(see docs/selection.md).",
    )
    normalize: list[NormalizedColumn] = Field(
        default_factory=list,
        description="Columns standardised per feature, (x - mean) / std, with the training "
        "data's statistics (gathered by the value checks: data.check_values full or sample): "
        "obs (new_obs with the same statistics), rewards, returns. Stored with the learner "
        "(learners.modules.*.input_stats, learners.column_stats), so every consumer passes "
        "raw observations and rewards (see docs/normalization.md).",
    )

    ignore_obs_features: list[int] = Field(
        default_factory=list,
        description="Observation features (indices of the flattened observation; 'a:b' for "
        "a..b-1) that every module reads as 0: the policy's observations and those inside "
        "an encoder's transitions, in training, evaluation and every consumer (stored with "
        "the learner, learners.modules.*.input_stats.ignored). For features that identify "
        "a training task without telling how to act in it, e.g. Meta-World reach's object, "
        "which is placed at random per task (see docs/normalization.md#ignored-features).",
    )

    @field_validator("ignore_obs_features", mode="before")
    @classmethod
    def _ranges(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        features: list[Any] = []
        for item in value:
            if isinstance(item, str) and re.fullmatch(r"\d+:\d+", item.strip()):
                low, high = (int(end) for end in item.split(":"))
                if low >= high:
                    raise ValueError(f"range {item!r} is empty; expected 'a:b' with a < b")
                features += range(low, high)
            else:
                features.append(item)
        return features

    @field_validator("ignore_obs_features")
    @classmethod
    def _distinct_features(cls, value: list[int]) -> list[int]:
        if any(i < 0 for i in value) or len(set(value)) != len(value):
            raise ValueError(f"expected distinct feature indices >= 0, got {value}")
        return value

    @field_validator("normalize", mode="before")
    @classmethod
    def _known_columns(cls, value: Any) -> Any:
        allowed = list(get_args(NormalizedColumn))
        for name in value if isinstance(value, list) else ():
            if name not in allowed:
                raise ValueError(f"got {name!r}; expected some of {allowed}")
        return value

    validation_memory_mb: float = Field(
        VALIDATION_MEMORY_MB,
        gt=0,
        description="Memory the id checks of validation may use (duplicates, gaps, end flags, "
        "task changes). Datasets whose rows times 80 bytes (160 for string eps_id) fit are "
        "checked in memory; larger "
        "ones are sorted on disk in a temporary directory, in about this much memory whatever "
        "their size (see docs/data-contract.md#memory).",
    )

    @field_validator("check_values", mode="before")
    @classmethod
    def _off_as_written(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` (in a config file or `--set data.check_values=off`) as
        # false: that is what the user wrote.
        return "off" if value is False else value


class ObsShiftConfig(BaseModel):
    """``tasks.shift_obs``: task augmentation by translation (``pipeline.tasks.obs_shift``)."""

    model_config = _STRICT

    features: list[list[int]] = Field(
        description="Groups of observation feature indices (of the flattened observation), "
        "all of one length: each task sample adds the same random offset to every group, in "
        "obs and new_obs of its support and query alike (e.g. [[0, 1, 2], [18, 19, 20]]: "
        "Meta-World's hand position now and in the previous frame)."
    )
    scale: float = Field(
        gt=0, description="Each coordinate of an offset is uniform in [-scale, scale]."
    )

    @model_validator(mode="after")
    def _groups(self) -> ObsShiftConfig:
        self.shift()
        return self

    def shift(self) -> ObsShift:
        """The feeds' ``ObsShift``."""
        return ObsShift(tuple(tuple(group) for group in self.features), self.scale)


class TasksConfig(BaseModel):
    """How task samples and meta-batches are drawn from the data."""

    model_config = _STRICT

    support_from: Literal["transitions", "episodes"] = Field(
        "transitions",
        description="What a support set is made of: transitions (K drawn at random from the "
        "task's rows) or episodes (support_episodes episodes of the task, the query set drawn "
        "from its other episodes; docs/episodes.md).",
    )
    support: int = Field(
        10, ge=1, description="K: support transitions per task sample (support_from: transitions)."
    )
    support_episodes: int = Field(
        1,
        ge=1,
        description="E: episodes per support set (support_from: episodes); K = E x the "
        "episode length, or E x support_window.",
    )
    support_window: int | None = Field(
        None,
        ge=1,
        description="W: consecutive steps taken from each support episode (support_from: "
        "episodes), so that episodes of different lengths stack; null: whole episodes, "
        "which must all have one length.",
    )
    query: int = Field(10, ge=1, description="Q: query transitions per task sample (disjoint).")
    meta_batch: int = Field(25, ge=1, description="M: task samples per meta-batch.")
    skip_small_tasks: bool = Field(
        False,
        description="Leave out tasks with fewer than K + Q transitions instead of refusing "
        "the dataset.",
    )
    seed: int = Field(0, ge=0, description="Shuffle seed of the task streams (epoch e: seed + e).")
    mode: Literal["auto", "memory", "stream"] = Field(
        "auto",
        description="memory: read the selected columns into memory once. stream: read windows "
        "of whole tasks each epoch, holding about memory_budget_mb (needs data sorted by "
        "task, as `offmeta data import` and `compact` write it). auto: stream when the "
        "selected columns would take more than memory_budget_mb in memory.",
    )
    memory_budget_mb: float = Field(
        2048.0,
        gt=0,
        description="Megabytes the training task samples may take in memory; above it, auto "
        "mode streams them in windows sized to it.",
    )
    shift_obs: ObsShiftConfig | None = Field(
        None,
        description="Task augmentation: a random offset per task sample added to groups of "
        "observation features, the task moved in space (docs/streams.md#shift-obs); the "
        "offsets come from seed and the epoch, so batches repeat and resume. null: none.",
    )

    def obs_shift(self) -> ObsShift | None:
        """The feeds' ``ObsShift`` (``shift_obs``), None without one."""
        return None if self.shift_obs is None else self.shift_obs.shift()

    @model_validator(mode="after")
    def _window_of_episodes(self) -> TasksConfig:
        if self.support_window is not None and self.support_from != "episodes":
            raise ValueError(
                f"support_window={self.support_window} takes steps of support episodes; "
                "support_from is 'transitions': set support_from to episodes or drop "
                "support_window"
            )
        return self


class LearnersConfig(MetaConfig):
    """The meta-learner (every ``learners.config.MetaConfig`` field), where it runs, and the
    run's check of its vmapped meta-gradients."""

    num_learners: int = Field(
        0,
        ge=0,
        description="0: train in this process. N > 0: N Ray Train workers, each with M tasks "
        "per meta-batch, meta-gradients averaged (see docs/scale-out.md).",
    )
    check_vectorized: Literal["first", "off"] = Field(
        "first",
        description="first: before the first meta-step, compare the vmapped meta-gradients of "
        "two tasks with a per-task loop's and refuse the run, naming the parameters, if they "
        "differ beyond the dtype's rounding (a wrong vmap batching rule; see "
        "docs/networks.md#vmap); off: skip it. Only with vectorize: vmap; changes no result.",
    )

    @field_validator("check_vectorized", mode="before")
    @classmethod
    def _off_as_written(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false, as for data.check_values.
        return "off" if value is False else value

    def meta_config(self) -> MetaConfig:
        """The learner's own config, without the run's own fields (placement, the self-check)."""
        return MetaConfig.model_validate(
            self.model_dump(exclude={"num_learners", "check_vectorized"})
        )


class TrainingConfig(BaseModel):
    """The meta-training loop, its checkpoints and retries."""

    model_config = _STRICT

    iterations: int = Field(1000, ge=1, description="Meta-steps (meta-batches) to train.")
    log_every: int = Field(100, ge=1, description="Iterations between progress lines.")
    history_points: int = Field(
        100,
        ge=1,
        description="Points of the learning curve (history.json, learning_curve.png) over the "
        "run: recorded every ceil(iterations / history_points) iterations and after the last "
        "one, whatever log_every is.",
    )
    checkpoint_every: int = Field(
        250, ge=1, description="Iterations between checkpoints (and after the last one)."
    )
    checkpoint_dir: str = Field(
        "runs",
        description="The runs root: one directory per run, <checkpoint_dir>/<id of the flow "
        "run that started it>/ (run.json, checkpoints/, finished.json); offmeta run --resume "
        "continues an unfinished one. A directory, a file:// URI or s3://bucket/prefix (S3 "
        "endpoint and credentials from the standard AWS_* environment variables; Ray Train "
        "runs only, learners.num_learners > 0). A Ray cluster of more than one node needs "
        "s3:// or a shared filesystem (shared_filesystem).",
    )
    shared_filesystem: bool = Field(
        False,
        description="checkpoint_dir and the datasets' local paths are on a filesystem every "
        "node of the Ray cluster mounts at the same path (NFS, Lustre...); without it a run on "
        "a cluster of more than one node refuses local paths before training "
        "(docs/run-storage.md).",
    )
    keep_checkpoints: int = Field(2, ge=1, description="Newest checkpoints kept per run.")
    keep_runs: int = Field(
        5,
        ge=1,
        description="Finished run directories kept under checkpoint_dir; older finished ones "
        "are removed when a run starts. Their results live on in the artifact store.",
    )
    keep_unfinished_days: float = Field(
        7.0,
        gt=0,
        description="Days an unfinished run directory (a killed or failed run, resumable with "
        "offmeta run --resume) is kept after its last checkpoint; one that a live process "
        "holds is never removed.",
    )
    retries: int = Field(
        2,
        ge=0,
        description="Retries of a failed training task; each resumes from its last checkpoint.",
    )
    retry_delay_s: float = Field(5.0, ge=0, description="Seconds before a retry.")
    warm_start: bool = Field(
        False,
        description="Start from the parameters of <artifacts.name>@latest (recorded as the "
        "parent) when a version exists; from the config's initialisation otherwise.",
    )
    seed: int = Field(0, ge=0, description="Seed of torch's global RNG before the first step.")
    device: str = Field("cpu", description="Torch device of the learner: cpu, cuda, cuda:N, mps.")
    torch_threads: int | None = Field(
        1,
        ge=1,
        description="torch intra-op threads during the run. 1 suits the small models of "
        "meta-learning on a few cores (measured on 2 busy cores: 4.9 ms per MAML step with 1 "
        "thread, 60 ms with 2); null keeps torch's default.",
    )
    prefetch: int = Field(
        2,
        ge=0,
        description="Meta-batches taken from the stream ahead of the learner by a thread "
        "(the stream's bookkeeping and finalize, the copy to the device, then overlap the "
        "step), never past the next checkpoint, so resuming stays exact; 0: the learner's "
        "thread takes them.",
    )

    @field_validator("checkpoint_dir")
    @classmethod
    def _valid_checkpoint_dir(cls, checkpoint_dir: str) -> str:
        if "://" in checkpoint_dir:
            try:
                parse_root(
                    checkpoint_dir, what="training.checkpoint_dir", writer="offmeta's run storage"
                )
            except UnsupportedRootError as error:
                raise ValueError(str(error)) from None
        return checkpoint_dir

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if not _DEVICE.fullmatch(device):
            raise ValueError(f"expected cpu, cuda, cuda:N or mps, got {device!r}")
        return device

    @property
    def history_every(self) -> int:
        """Iterations between two points of the learning curve (``history_points``)."""
        return -(-self.iterations // self.history_points)


class EvaluationConfig(BaseModel):
    """Adaptation on held-out tasks after training."""

    model_config = _STRICT

    steps: tuple[int, ...] = Field(
        (0, 1, 5, 10),
        description="Inner steps after which the query loss is measured; must include 0 "
        "(before adaptation).",
    )
    tasks: int = Field(50, ge=1, description="Held-out tasks evaluated (all if fewer exist).")
    rollout_episodes: int = Field(
        10,
        ge=0,
        description="Episodes per held-out task rolled out in the task's environment "
        "(evaluation.env, or the point robot's); 0 skips rollouts.",
    )
    rollout_adapt_steps: int = Field(
        5, ge=1, description="Inner steps on the task's support transitions before rollouts."
    )
    seed: int = Field(0, ge=0, description="Seed of the held-out samples and rollout starts.")
    context: Literal["offline", "online"] = Field(
        "offline",
        description="Where a held-out task's support set (its context) comes from: offline, "
        "the task's recorded data (as tasks.support_from draws it); online, context_episodes "
        "exploration episodes in the task's environment (evaluation.env; context_explore "
        "says which policy runs them), recorded as transitions "
        "(docs/episodes.md#online-context).",
    )
    context_episodes: int = Field(
        1,
        ge=1,
        description="Exploration episodes per held-out task with context: online; each gives "
        "its first tasks.support_window steps (or all of the shortest episode's length).",
    )
    context_window: int | Literal["whole"] | None = Field(
        None,
        description="Steps of each recorded episode in a held-out task's context "
        "(tasks.support_from: episodes, context: offline): null, training's "
        "(tasks.support_window); W, W consecutive steps; whole, the whole episode (every "
        "held-out episode must then have one length). An encoder that pools its context's "
        "steps tells the task better from more of them (docs/episodes.md#context-window). "
        "Online exploration episodes keep their own rule (docs/episodes.md#online-context).",
    )
    context_explore: ContextExplore = Field(
        "prior",
        description="Which policy runs the exploration episodes of context: online. prior: "
        "the unadapted policy, every episode. posterior (PEARL's sequential posterior "
        "sampling): episode 1 the unadapted policy, episode k the policy adapted "
        "(rollout_adapt_steps, the learner's own adapt) on the windows of episodes 1..k-1 of "
        "the same task. refine: episode 1 the unadapted policy, episode k the parameters of "
        "episode k-1 moved context_refine_step times the way adapting on episode k-1 alone "
        "moves them; the support set is then the window of the task's exploration episode "
        "with the highest return (IDAQ's return-based choice of context). library: the "
        "training tasks' policies (each adapted on its recorded context) take turns, one "
        "window of tasks.support_window steps each, then the best-scoring one runs on; the "
        "support set is the window that scored best (context_score_steps, "
        "docs/episodes.md#library). prior is the default: posterior feeds the learner's guess "
        "back into its context, and an encoder that reads actions (as the shipped context "
        "configs do) then reads its own adapted actions, which echo that guess instead of "
        "telling the task. With one episode prior, posterior and refine are the same "
        "(docs/episodes.md#online-context).",
    )
    context_refine_step: float = Field(
        1.0,
        gt=0,
        description="context_explore: refine's step: 1 explores each episode with the "
        "policy adapted on the one before; above 1 goes further the same way "
        "(docs/episodes.md#refine).",
    )
    context_score_steps: int = Field(
        10,
        ge=1,
        description="context_explore: library's score of a window: the mean reward of its "
        "last context_score_steps steps (at most tasks.support_window).",
    )
    env: str | None = Field(
        None,
        description="The held-out tasks' Gymnasium environment, 'package.module:callable', "
        "called as callable(task_id, params, **env_kwargs) for each task (docs/evaluation.md); "
        "null: the point robot's for point_robot datasets, no rollouts for others.",
    )
    env_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of every evaluation.env call."
    )
    task_params_columns: tuple[str, ...] | None = Field(
        None,
        description="Columns of the held-out rows whose values (one per task) are the params "
        "of evaluation.env; null: the task's entry in dataset.json 'tasks'.",
    )
    sample: bool = Field(
        False,
        description="Roll out actions sampled from the policy head instead of its mean "
        "(continuous) or argmax (discrete).",
    )
    max_episode_steps: int = Field(
        1000, ge=1, description="Rollout episodes still running after this many steps are cut."
    )

    @field_validator("env")
    @classmethod
    def _import_path(cls, env: str | None) -> str | None:
        module, sep, name = (env or "").partition(":")
        if env is not None and not (sep and module and name):
            raise ValueError(f"expected 'package.module:callable', got {env!r}")
        return env

    @field_validator("task_params_columns")
    @classmethod
    def _some_columns(cls, columns: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if columns is not None and not columns:
            raise ValueError("expected at least one column, or null for dataset.json 'tasks'")
        return columns

    @field_validator("context_window", mode="before")
    @classmethod
    def _window_or_whole(cls, value: Any) -> Any:
        if value is None or value == "whole":
            return value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"expected an int >= 1, 'whole' or null, got {value!r}")
        return value

    @model_validator(mode="after")
    def _refine_step_refines(self) -> EvaluationConfig:
        if self.context_refine_step != 1.0 and self.context_explore != "refine":
            raise ValueError(
                f"context_refine_step is {self.context_refine_step}, but only context_explore "
                f"'refine' takes a step and it is {self.context_explore!r}: set "
                "context_explore to refine or drop context_refine_step"
            )
        return self

    @model_validator(mode="after")
    def _score_steps_score_library_windows(self) -> EvaluationConfig:
        if self.context_score_steps != 10 and self.context_explore != "library":
            raise ValueError(
                f"context_score_steps is {self.context_score_steps}, but only context_explore "
                f"'library' scores windows and it is {self.context_explore!r}: set "
                "context_explore to library or drop context_score_steps"
            )
        return self

    @model_validator(mode="after")
    def _online_rolls_out(self) -> EvaluationConfig:
        if self.context == "online" and self.rollout_episodes == 0:
            raise ValueError(
                "context 'online' collects each held-out task's support set in its environment "
                "and rolls the adapted policy out there, but rollout_episodes is 0: set "
                "rollout_episodes >= 1 or context to offline"
            )
        return self

    @field_validator("steps")
    @classmethod
    def _steps_from_zero(cls, steps: tuple[int, ...]) -> tuple[int, ...]:
        if any(step < 0 for step in steps):
            raise ValueError(f"steps must be >= 0, got {list(steps)}")
        if 0 not in steps:
            raise ValueError(
                f"steps must include 0 (the loss before adaptation), got {list(steps)}"
            )
        return tuple(sorted(set(steps)))


class MlflowConfig(BaseModel):
    """The MLflow model registry each published version is mirrored to (``pipeline.mlflow``).

    The offmeta store stays the source of truth: the mirror runs after the version is
    published, and a mirror that keeps failing only reports the version as not mirrored
    (``offmeta artifacts mirror NAME --to mlflow`` backfills it later).
    """

    model_config = _STRICT

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking server, e.g. http://mlflow.internal:5000; null: the "
        "MLFLOW_TRACKING_URI environment variable of the run.",
    )
    experiment: str = Field(
        "offmeta",
        min_length=1,
        description="MLflow experiment the mirrored runs are logged in (created when missing).",
    )
    registered_model: str | None = Field(
        None,
        min_length=1,
        description="Registered model each version becomes a version of; null: artifacts.name.",
    )
    attempts: int = Field(
        3,
        ge=1,
        description="Tries of the mirror after a publish before the run reports the version "
        "as not mirrored (the run itself still succeeds).",
    )
    retry_delay_s: float = Field(2.0, ge=0, description="Seconds between two tries.")
    timeout_s: float = Field(
        30.0,
        gt=0,
        description="Seconds the mirror may take in all, every attempt and the waits between "
        "them together; past them the version is reported as not mirrored (each request to "
        "MLflow is made once, with at most the seconds left as its timeout).",
    )


class ArtifactsConfig(BaseModel):
    """Where results are published."""

    model_config = _STRICT

    root: str = Field(
        "artifacts",
        description="Artifact store: a directory, a file:// URI or s3://bucket/prefix (S3 "
        "endpoint and credentials from the standard AWS_* environment variables).",
    )
    name: str = Field(description="Artifact name; each run publishes its next version.")
    mlflow: MlflowConfig | None = Field(
        None,
        description="Also mirror every published version to an MLflow model registry; null: "
        "no mirror (docs/mlflow.md).",
    )

    @property
    def registered_model(self) -> str | None:
        """The MLflow registered model of the mirror (None without ``mlflow``)."""
        if self.mlflow is None:
            return None
        return self.mlflow.registered_model or self.name

    @field_validator("root")
    @classmethod
    def _valid_root(cls, root: str) -> str:
        try:
            parse_root(root)
        except UnsupportedRootError as error:
            raise ValueError(str(error)) from None
        return root

    @field_validator("name")
    @classmethod
    def _valid_name(cls, name: str) -> str:
        try:
            return validate_name(name)
        except ArtifactNameError as error:
            raise ValueError(str(error)) from None


class RayConfig(BaseModel):
    """The Ray session the run reads its data with (unused when Ray is already running)."""

    model_config = _STRICT

    address: str | None = Field(
        None,
        description="null: start a local Ray for this run; 'auto': join the running cluster; "
        "'ray://host:port': connect with Ray Client.",
    )
    num_cpus: int | None = Field(
        None, ge=1, description="CPUs of a local Ray (null: all); only with address null."
    )
    reserved_read_cpus: float = Field(
        0.5,
        ge=0,
        description="CPUs kept free for Ray Data reads when learners run as Ray Train workers "
        "(num_learners > 0), so the workers cannot starve the reads.",
    )
    max_failures: int = Field(
        2,
        ge=0,
        description="Worker failures Ray Train recovers from (restarting the worker group "
        "from its last checkpoint) before the train task fails; num_learners > 0 only. "
        "Separate from training.retries, which retries the whole train task.",
    )

    placement_strategy: Literal["PACK", "SPREAD", "STRICT_SPREAD"] = Field(
        "PACK",
        description="How Ray places the Ray Train workers (one bundle each) on the cluster's "
        "nodes: PACK as few nodes as possible, SPREAD over as many as possible, STRICT_SPREAD "
        "each on a different node (fails to start with fewer nodes than workers).",
    )
    runtime_env: dict[str, Any] | None = Field(
        None,
        description="Ray runtime environment of the run's workers (passed to ray.init), to "
        "ship offmeta to nodes that lack it, e.g. {working_dir: ., pip: [...]} or "
        "{py_modules: [...]}; null: the nodes' own Python environment (docs/run-storage.md).",
    )

    @model_validator(mode="after")
    def _cpus_only_locally(self) -> RayConfig:
        if self.num_cpus is not None and self.address is not None:
            raise ValueError(
                f"num_cpus applies to a local Ray only; address is {self.address!r} "
                "(the cluster decides its CPUs): drop num_cpus or set address to null"
            )
        return self


class MetaTrainConfig(BaseModel):
    """Everything one meta-training run depends on; stored with every published version."""

    model_config = _STRICT

    data: DataConfig = Field(description="Train and held-out datasets.")
    tasks: TasksConfig = Field(default_factory=TasksConfig, description="Task sampling.")
    learners: LearnersConfig = Field(
        default_factory=LearnersConfig,
        description="Meta-learner: modules (each with its model and loss), algorithm, inner "
        "rule, outer optimizer; plus num_learners.",
    )
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Training loop.")
    evaluation: EvaluationConfig = Field(
        default_factory=EvaluationConfig, description="Held-out evaluation."
    )
    artifacts: ArtifactsConfig = Field(description="Artifact store and name.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray session.")

    @model_validator(mode="after")
    def _context_of_episodes(self) -> MetaTrainConfig:
        window = self.evaluation.context_window
        if window is not None and self.tasks.support_from != "episodes":
            raise ValueError(
                f"evaluation.context_window={window!r} takes steps of a held-out task's context "
                "episodes; tasks.support_from is 'transitions': set tasks.support_from to "
                "episodes or drop evaluation.context_window"
            )
        return self

    @model_validator(mode="after")
    def _library_windows(self) -> MetaTrainConfig:
        if self.evaluation.context_explore != "library":
            return self
        window, score = self.tasks.support_window, self.evaluation.context_score_steps
        if window is None:
            raise ValueError(
                "evaluation.context_explore 'library' gives each training task's policy a "
                "window of tasks.support_window steps, but tasks.support_window is null: set "
                "it (with tasks.support_from: episodes)"
            )
        if score > window:
            raise ValueError(
                f"evaluation.context_score_steps={score} scores the last steps of a window of "
                f"tasks.support_window={window}: expected at most {window}"
            )
        return self

    @model_validator(mode="after")
    def _s3_runs_on_ray_train(self) -> MetaTrainConfig:
        checkpoint_dir = self.training.checkpoint_dir
        if checkpoint_dir.lower().startswith("s3://") and self.learners.num_learners == 0:
            raise ValueError(
                f"training.checkpoint_dir={checkpoint_dir!r} is run storage for Ray Train "
                "workers; learners.num_learners=0 trains in this process, which checkpoints to "
                "a local directory: set learners.num_learners >= 1 or a local checkpoint_dir"
            )
        return self


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> MetaTrainConfig:
    """Read ``path`` (YAML), apply ``KEY=VALUE`` overrides and validate.

    Raises ``ConfigError`` whose message names the file and lists one problem per line:
    the field path, what is wrong and the value found.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror or error}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"config {path} is not valid YAML: {one_line(error)}") from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise ConfigError(
            f"config {path} must be a YAML mapping of sections, found a {type(document).__name__}"
        )
    for override in overrides:
        apply_override(document, override)
    return validate_config(document, source=str(path))


def validate_config(document: Mapping[str, Any], *, source: str = "config") -> MetaTrainConfig:
    """Validate a parsed config, raising ``ConfigError`` (one line per problem)."""
    try:
        return MetaTrainConfig.model_validate(document)
    except ValidationError as error:
        lines = format_errors(error, MetaTrainConfig)
        raise ConfigError(
            f"invalid config {source} ({len(lines)} error{'s' if len(lines) > 1 else ''}):\n"
            + "\n".join(f"  {line}" for line in lines)
        ) from None
