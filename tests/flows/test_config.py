"""MetaTrainConfig: the shipped YAML files, --set overrides, and one-line-per-error messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.config import (
    ConfigError,
    LearnersConfig,
    MetaTrainConfig,
    apply_override,
    load_config,
    validate_config,
)
from learners.config import MetaConfig
from tests.helpers.fresh_python import fresh_python
from tests.helpers.paths import REPO

CONFIGS = REPO / "flows" / "configs"
POINT_ROBOT = CONFIGS / "point_robot.yaml"


def _error(overrides: list[str], path: Path = POINT_ROBOT) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides)
    return str(caught.value)


@pytest.mark.parametrize("name", ["point_robot.yaml", "sinusoid.yaml"])
def test_shipped_configs_validate_and_fit_their_samples(name: str) -> None:
    cfg = load_config(CONFIGS / name)
    dataset = name.removesuffix(".yaml")
    assert cfg.data.train == f"data/samples/{dataset}/train"
    assert cfg.data.heldout == f"data/samples/{dataset}/heldout"
    assert cfg.evaluation.steps == (0, 1, 5, 10)
    assert cfg.learners.num_learners == 0
    # The learner section is a MetaConfig: the learner part rebuilds without the run's own
    # fields (placement, the vectorized self-check).
    meta = cfg.learners.meta_config()
    assert type(meta) is MetaConfig
    assert meta.model_dump() == cfg.learners.model_dump(
        exclude={"num_learners", "check_vectorized"}
    )


def test_overrides_reach_nested_learner_fields_and_are_parsed_as_yaml() -> None:
    cfg = load_config(
        POINT_ROBOT,
        [
            "learners.inner.lr=0.05",
            "evaluation.steps=[3, 0, 1, 1]",
            "training.warm_start=true",
            "learners.modules.default_policy.model.hidden_sizes=[16, 16]",
            "artifacts.name=nightly",
        ],
    )
    assert cfg.learners.inner.lr == 0.05
    assert cfg.evaluation.steps == (0, 1, 3)
    assert cfg.training.warm_start is True
    assert cfg.learners.modules["default_policy"].model.hidden_sizes == (16, 16)
    assert cfg.artifacts.name == "nightly"


def test_a_bare_off_switches_the_compiled_step_off() -> None:
    # YAML 1.1 reads `off` as false; the field takes it as written.
    assert load_config(POINT_ROBOT, ["learners.compile=off"]).learners.compile == "off"
    assert load_config(POINT_ROBOT, ["learners.compile=default"]).learners.compile == "default"


def test_value_checks_default_to_full_and_can_be_lowered() -> None:
    assert load_config(POINT_ROBOT).data.check_values == "full"
    assert load_config(POINT_ROBOT, ["data.check_values=sample"]).data.check_values == "sample"


def test_dumped_config_validates_back_to_the_same_config() -> None:
    # Deployments (offmeta serve) pass the config as a JSON parameter and get it back.
    cfg = load_config(POINT_ROBOT, ["learners.algorithm=metasgd"])
    again = MetaTrainConfig.model_validate(cfg.model_dump(mode="json"))
    assert again == cfg
    assert again.learners.inner.learned_lr == "element"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_config_validates_back_from_its_dump(path: Path) -> None:
    # A run records its config this way (--resume reads it back), and Ray Train workers get
    # theirs so: data.episodes_where's conditions once dumped all three tests, refused.
    cfg = load_config(path)
    for mode in ("json", "python"):
        assert MetaTrainConfig.model_validate(cfg.model_dump(mode=mode)) == cfg


def test_an_episode_condition_dumps_only_its_own_test() -> None:
    cfg = load_config(
        POINT_ROBOT,
        ["data.episodes_where={train: [{column: b, in: [x]}, {column: c, ever: true}]}"],
    )
    dumped = cfg.model_dump(mode="json", by_alias=True)["data"]["episodes_where"]["train"]
    assert dumped == [{"column": "b", "in": ["x"]}, {"column": "c", "ever": True}]


def test_learners_section_is_a_meta_config_plus_placement() -> None:
    assert issubclass(LearnersConfig, MetaConfig)
    own = set(LearnersConfig.model_fields) - set(MetaConfig.model_fields)
    assert own == {"num_learners", "check_vectorized"}


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["learners.inner.lr=-1"], "learners.inner.lr: Input should be greater than 0 (got -1)"),
        (
            ["tasks.suport=3"],
            "tasks.suport: unknown field; expected one of: memory_budget_mb, meta_batch, "
            "mode, query, seed, shift_obs, skip_small_tasks, support, support_episodes, "
            "support_from, support_window",
        ),
        (
            ["learners.modules.default_policy.bogus=1"],
            "learners.modules.default_policy.bogus: unknown field; expected one of: "
            "action_dim, data_module, input_stats, latent_dim, loss, model, obs_dim, obs_shape",
        ),
        (
            ["evaluation.steps=[1, 5]"],
            "evaluation.steps: steps must include 0 (the loss before adaptation), got [1, 5]",
        ),
        (["training.device=tpu"], "training.device: expected cpu, cuda, cuda:N or mps, got 'tpu'"),
        (
            ["ray.address=auto", "ray.num_cpus=2"],
            "ray: num_cpus applies to a local Ray only; address is 'auto' (the cluster decides "
            "its CPUs): drop num_cpus or set address to null",
        ),
        (
            ["learners.algorithm=fomaml", "learners.inner.first_order=false"],
            "learners: algorithm 'fomaml' sets inner.first_order=True; choose maml instead, "
            "or drop inner.first_order",
        ),
        (
            ["artifacts.name=bad/name"],
            "artifacts.name: artifact name 'bad/name' contains the path separator '/'; expected "
            "a single name made of letters, digits, '.', '_' and '-', starting with a letter or "
            "digit (e.g. 'sinusoid-maml')",
        ),
        (
            ["data.check_values=fast"],
            "data.check_values: Input should be 'full', 'sample' or 'off' (got 'fast')",
        ),
        (
            ["evaluation.context_explore=greedy"],
            "evaluation.context_explore: Input should be 'prior', 'posterior', 'refine' or "
            "'library' (got 'greedy')",
        ),
        (
            ["evaluation.context_refine_step=2"],
            "evaluation: context_refine_step is 2.0, but only context_explore 'refine' takes a "
            "step and it is 'prior': set context_explore to refine or drop context_refine_step",
        ),
        (
            ["evaluation.context_explore=refine", "evaluation.context_refine_step=0"],
            "evaluation.context_refine_step: Input should be greater than 0 (got 0)",
        ),
        (
            ["evaluation.context_score_steps=5"],
            "evaluation: context_score_steps is 5, but only context_explore 'library' scores "
            "windows and it is 'prior': set context_explore to library or drop "
            "context_score_steps",
        ),
        (
            ["evaluation.context_explore=library", "evaluation.context_score_steps=0"],
            "evaluation.context_score_steps: Input should be greater than or equal to 1 (got 0)",
        ),
        (
            ["evaluation.context_explore=library"],
            "<config>: evaluation.context_explore 'library' gives each training task's policy a "
            "window of tasks.support_window steps, but tasks.support_window is null: set it "
            "(with tasks.support_from: episodes)",
        ),
        (
            [
                "evaluation.context_explore=library",
                "tasks.support_from=episodes",
                "tasks.support_window=8",
                "evaluation.context_score_steps=9",
            ],
            "<config>: evaluation.context_score_steps=9 scores the last steps of a window of "
            "tasks.support_window=8: expected at most 8",
        ),
        (
            ["data.validation_memory_mb=0"],
            "data.validation_memory_mb: Input should be greater than 0 (got 0)",
        ),
        (
            ["learners.num_learners=-1"],
            "learners.num_learners: Input should be greater than or equal to 0 (got -1)",
        ),
    ],
)
def test_an_invalid_value_is_refused_with_its_field_path_and_reason(
    overrides: list[str], line: str
) -> None:
    assert _error(overrides) == f"invalid config {POINT_ROBOT} (1 error):\n  {line}"


def test_every_error_gets_its_own_line() -> None:
    message = _error(["training.iterations=many", "tasks.meta_batch=0"])
    assert message == (
        f"invalid config {POINT_ROBOT} (2 errors):\n"
        "  tasks.meta_batch: Input should be greater than or equal to 1 (got 0)\n"
        "  training.iterations: Input should be a valid integer, unable to parse string as an "
        "integer (got 'many')"
    )


def test_required_sections_are_named_when_missing(tmp_path: Path) -> None:
    path = tmp_path / "partial.yaml"
    path.write_text("tasks: {support: 5}\n")
    assert _error([], path) == (
        f"invalid config {path} (2 errors):\n"
        "  data: required field is missing\n"
        "  artifacts: required field is missing"
    )


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "learners.inner.lr",
            "--set 'learners.inner.lr': expected KEY=VALUE with a dotted key, e.g. --set "
            "learners.inner.lr=0.05",
        ),
        (
            "training..iterations=3",
            "--set 'training..iterations=3': expected KEY=VALUE with a dotted key, e.g. --set "
            "learners.inner.lr=0.05",
        ),
        (
            "training.iterations.every=3",
            "--set 'training.iterations.every=3': training.iterations is 3000, not a section; "
            "cannot set every inside it",
        ),
    ],
)
def test_malformed_overrides_are_refused(override: str, message: str) -> None:
    assert _error([override]) == message


def test_an_override_value_must_be_yaml() -> None:
    assert _error(["tasks.seed=[1"]).startswith(
        "--set 'tasks.seed=[1': value is not valid YAML: while parsing a flow sequence"
    )


def test_unreadable_or_malformed_files_are_refused(tmp_path: Path) -> None:
    missing = tmp_path / "missing.yaml"
    assert _error([], missing) == f"cannot read config {missing}: No such file or directory"
    listing = tmp_path / "list.yaml"
    listing.write_text("- data\n- tasks\n")
    assert _error([], listing) == (
        f"config {listing} must be a YAML mapping of sections, found a list"
    )
    broken = tmp_path / "broken.yaml"
    broken.write_text("data: {train: [\n")
    assert _error([], broken).startswith(f"config {broken} is not valid YAML: ")


def test_apply_override_creates_sections_and_validate_config_names_its_source() -> None:
    document: dict = {}
    apply_override(document, "ray.address=ray://head:10001")
    assert document == {"ray": {"address": "ray://head:10001"}}
    with pytest.raises(ConfigError) as caught:
        validate_config(document, source="the test")
    assert str(caught.value).startswith("invalid config the test (2 errors):\n")


def test_reading_a_run_config_imports_neither_torch_nor_ray_nor_prefect():
    # `offmeta run` refuses a bad config before the seconds those imports take.
    probe = (
        "import sys\nfrom flows.config import load_config\n"
        "load_config('flows/configs/point_robot.yaml', ['learners.inner.lr=0.05'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'ray', 'prefect'}))"
    )
    assert fresh_python(probe) == "[]"


def test_the_learners_package_gives_its_names_on_first_use():
    import learners
    from learners.meta.learner import MetaLearner

    assert learners.MetaLearner is MetaLearner
    assert set(learners.__all__) <= set(dir(learners))
    with pytest.raises(AttributeError, match="module 'learners' has no attribute 'Nope'"):
        _ = learners.Nope
