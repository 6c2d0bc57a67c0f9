"""Run directories: what identifies a run's config, which run ``--resume`` picks and why it
refuses the others, and which old runs are pruned."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from flows.config import MetaTrainConfig
from flows.runs.retention import prune_runs
from flows.runs.run_dirs import (
    LOCK_FILE,
    RUN_FILE,
    RunDirError,
    abandoned_flow_runs,
    check_resumable,
    config_identity,
    find_resumable,
    live_pid,
    open_run,
    read_run,
)
from tests.helpers.flow_runs import tiny_config

DAY = 86400.0
EARLIER_RELEASE = Path(__file__).parent / "fixtures" / "run-90212f8"
"""``run.json`` of a run started by offmeta at 90212f8 (the first release with run
directories, 29 config fields fewer than today) with ``tiny_config(/fixture/data, /fixture)``:
written by that commit's ``flows.runs.open_run``, unchanged since."""
EARLIER_FLOW_RUN = "5d2c7a90-written-by-90212f8"


def _cfg(work: Path, overrides: Sequence[str] = ()) -> MetaTrainConfig:
    return tiny_config(work / "data", work, overrides)


def _run(cfg: MetaTrainConfig, flow_run_id: str, *, finished: bool = False) -> Path:
    """A run that started (and, with ``finished``, published) and whose process is gone."""
    with open_run(cfg, resume=None, flow_run_id=flow_run_id) as run:
        if finished:
            run.finish(f"{cfg.artifacts.name}:1", "file:///x")
    return run.path


def _age(path: Path, days: float, now: float) -> None:
    """Make every directory of the run (and run.json) ``days`` old."""
    stamp = now - days * DAY
    for directory, _, files in os.walk(path):
        for name in files:
            os.utime(Path(directory) / name, (stamp, stamp))
        os.utime(directory, (stamp, stamp))


def test_the_identity_ignores_only_how_a_run_is_run(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    same = _cfg(
        tmp_path,
        [
            "training.retries=5",
            "training.retry_delay_s=1",
            f"training.checkpoint_dir={tmp_path / 'elsewhere'}",
            "training.keep_checkpoints=9",
            "training.keep_runs=1",
            "training.keep_unfinished_days=0.5",
            "learners.check_vectorized=off",
        ],
    )
    assert config_identity(same) == config_identity(cfg)
    assert config_identity(cfg).startswith("sha256:")
    for override in ("training.iterations=13", "tasks.seed=1", "evaluation.tasks=3"):
        assert config_identity(_cfg(tmp_path, [override])) != config_identity(cfg), override


def test_a_run_records_its_config_and_starts_and_holds_its_lock(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    with open_run(cfg, resume=None, flow_run_id="flow-a") as run:
        assert run.path == tmp_path / "runs" / "flow-a"
        assert (run.run_id, run.earlier_flow_runs) == ("flow-a", [])
        assert live_pid(run.path) == os.getpid()
        record = read_run(run.path)
        assert (record.artifact, record.identity) == ("tiny-robot", config_identity(cfg))
        assert record.config == cfg.model_dump(mode="json")
        assert [start["flow_run_id"] for start in record.starts] == ["flow-a"]
        assert record.finished is None
    assert live_pid(run.path) is None

    with open_run(cfg, resume=run.path, flow_run_id="flow-b") as resumed:
        assert resumed.earlier_flow_runs == ["flow-a"]
        resumed.finish("tiny-robot:3", "file:///store/3.json")
    record = read_run(run.path)
    assert [start["flow_run_id"] for start in record.starts] == ["flow-a", "flow-b"]
    assert record.finished["artifact"] == "tiny-robot:3"
    assert sorted(p.name for p in run.path.iterdir()) == ["finished.json", RUN_FILE, LOCK_FILE]


def test_resume_picks_the_newest_unfinished_run_of_the_same_config(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    old = _run(cfg, "old")
    _run(cfg, "done", finished=True)
    _run(_cfg(tmp_path, ["training.iterations=24"]), "longer")
    newest = _run(cfg, "newest")
    (tmp_path / "runs" / "foreign").mkdir()
    assert find_resumable(cfg) == newest
    # A run another process holds is running, not resumable.
    with open_run(cfg, resume=newest, flow_run_id="again"):
        assert find_resumable(cfg) == old
    assert abandoned_flow_runs(tmp_path / "runs") == [
        ("longer", tmp_path / "runs" / "longer"),
        ("newest", newest),
        ("again", newest),
        ("old", old),
    ]


def test_resume_without_a_run_to_resume_says_what_it_found(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    with pytest.raises(RunDirError) as caught:
        find_resumable(cfg)
    assert str(caught.value) == (
        f"no unfinished run of 'tiny-robot' with this config under {tmp_path / 'runs'}; run "
        "without --resume to start a new run, or name a run directory with --resume RUN_DIR"
    )
    longer = _run(_cfg(tmp_path, ["training.iterations=24", "tasks.seed=3"]), "longer")
    _run(_cfg(tmp_path, ["artifacts.name=other"]), "other")
    with pytest.raises(RunDirError) as caught:
        find_resumable(cfg)
    assert str(caught.value) == (
        f"no unfinished run of 'tiny-robot' with this config under {tmp_path / 'runs'} "
        f"(unfinished runs of that name: {longer}: it was started with another config, which "
        "differs in tasks.seed (run: 3, now: 0), training.iterations (run: 24, now: 12); "
        "resume it with that config or start a new run); run without --resume to start a new "
        "run, or name a run directory with --resume RUN_DIR"
    )


def test_a_named_run_directory_is_checked_before_anything_starts(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    finished = _run(cfg, "done", finished=True)
    unfinished = _run(cfg, "killed")
    check_resumable(read_run(unfinished), cfg)

    def refused(path: Path, with_cfg: MetaTrainConfig = cfg) -> str:
        with pytest.raises(RunDirError) as caught:
            check_resumable(read_run(path), with_cfg)
        return str(caught.value)

    finished_at = read_run(finished).finished["finished_at"]
    assert refused(finished) == (
        f"{finished} finished at {finished_at} and published tiny-robot:1; nothing to resume. "
        "Run without --resume to start a new run"
    )
    assert refused(unfinished, _cfg(tmp_path, ["learners.inner.lr=0.25"])) == (
        f"{unfinished}: it was started with another config, which differs in "
        "learners.inner.lr (run: 0.5, now: 0.25); resume it with that config or start a new run"
    )
    assert refused(unfinished, _cfg(tmp_path, ["artifacts.name=other"])) == (
        f"{unfinished}: it publishes 'tiny-robot', not 'other'; resume it with its own config"
    )
    with open_run(cfg, resume=unfinished, flow_run_id="now"):
        assert refused(unfinished) == (
            f"{unfinished}: it is running: process {os.getpid()} holds its run.lock; wait for "
            "that run to end or stop it first"
        )
        with (
            pytest.raises(RunDirError) as caught,
            open_run(cfg, resume=unfinished, flow_run_id="x"),
        ):
            pass
        assert str(caught.value) == refused(unfinished)
    with pytest.raises(RunDirError) as caught:
        read_run(tmp_path / "nowhere")
    assert str(caught.value) == f"{tmp_path / 'nowhere'}: no such run directory"
    with pytest.raises(RunDirError) as caught:
        read_run(tmp_path)
    assert str(caught.value) == (
        f"{tmp_path} is not an offmeta run directory (it has no run.json); expected a "
        "directory under training.checkpoint_dir, e.g. runs/<flow run id>"
    )


def test_pruning_keeps_the_newest_finished_runs_and_recent_unfinished_ones(
    tmp_path: Path,
) -> None:
    cfg = _cfg(tmp_path)
    root = tmp_path / "runs"
    finished = [_run(cfg, f"done-{i}", finished=True) for i in range(4)]
    recent, stale, held = (_run(cfg, name) for name in ("recent", "stale", "held"))
    (root / "foreign").mkdir()
    (root / ".removing-interrupted" / "checkpoints").mkdir(parents=True)
    now = os.path.getmtime(recent / RUN_FILE)
    for path in (stale, held, *finished):
        _age(path, 30, now)
    with open_run(cfg, resume=held, flow_run_id="again"):
        _age(held, 30, now)
        removed = prune_runs(root, keep_finished=2, keep_unfinished_days=7, now=now)
    assert removed == [finished[1], finished[0], stale]
    assert sorted(p.name for p in root.iterdir()) == [
        "done-2",
        "done-3",
        "foreign",
        "held",
        "recent",
    ]
    # Once its process is gone, the held run is as stale as its last checkpoint says.
    assert prune_runs(root, keep_finished=2, keep_unfinished_days=7, now=now) == [held]
    assert prune_runs(root, keep_finished=2, keep_unfinished_days=7, now=now) == []


def test_an_unfinished_run_counts_as_recent_while_its_checkpoints_are(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path)
    run = _run(cfg, "long")
    now = os.path.getmtime(run / RUN_FILE) + 30 * DAY
    (run / "checkpoints" / "ckpt-00000008").mkdir(parents=True)
    _age(run, 30, now)
    os.utime(run / "checkpoints", (now - DAY, now - DAY))  # a checkpoint a day ago
    assert prune_runs(tmp_path / "runs", keep_finished=1, keep_unfinished_days=7, now=now) == []
    assert json.loads((run / RUN_FILE).read_text())["artifact"] == "tiny-robot"


def _earlier_run(work: Path, edit: dict[str, dict[str, object]] | None = None) -> Path:
    """The earlier release's run directory under ``work/runs``; ``edit`` sets recorded
    config values (``{section: {field: value}}``)."""
    run = work / "runs" / EARLIER_FLOW_RUN
    run.mkdir(parents=True)
    document = json.loads((EARLIER_RELEASE / RUN_FILE).read_text())
    for section, fields in (edit or {}).items():
        document["config"][section].update(fields)
    (run / RUN_FILE).write_text(json.dumps(document))
    return run


def _earlier_cfg(work: Path, overrides: Sequence[str] = ()) -> MetaTrainConfig:
    """Today's config of the earlier run: the same YAML, runs under ``work/runs``."""
    moved = [f"training.checkpoint_dir={work / 'runs'}", *overrides]
    return tiny_config(Path("/fixture/data"), Path("/fixture"), moved)


def test_a_run_an_earlier_offmeta_started_resumes_when_its_config_means_the_same(
    tmp_path: Path,
) -> None:
    run = _earlier_run(tmp_path)
    cfg = _earlier_cfg(tmp_path)
    record = read_run(run)
    # Its writer hashed fewer fields: the recorded identity is not today's, yet the run is
    # the same run, because every field added since takes the value it had then.
    assert record.identity != config_identity(cfg)
    assert find_resumable(cfg) == run
    check_resumable(record, cfg)
    with open_run(cfg, resume=run, flow_run_id="flow-now") as resumed:
        assert resumed.earlier_flow_runs == [EARLIER_FLOW_RUN]
    after = read_run(run)
    assert [start["flow_run_id"] for start in after.starts] == [EARLIER_FLOW_RUN, "flow-now"]
    assert (after.config, after.identity) == (record.config, record.identity)


def test_a_record_without_the_fields_at_their_defaults_has_the_same_identity(
    tmp_path: Path,
) -> None:
    # What any earlier release wrote that knew only the fields this config sets: every field
    # added later, at its default, leaves the run's identity alone.
    cfg = _cfg(tmp_path)
    path = _run(cfg, "sparse")
    document = json.loads((path / RUN_FILE).read_text())
    document["config"] = cfg.model_dump(mode="json", exclude_defaults=True)
    document["identity"] = config_identity(document["config"])  # as its writer hashed it
    assert len(json.dumps(document["config"])) < len(json.dumps(cfg.model_dump(mode="json"))) / 2
    (path / RUN_FILE).write_text(json.dumps(document))
    assert find_resumable(cfg) == path


def test_an_earlier_run_is_refused_naming_the_fields_that_differ(tmp_path: Path) -> None:
    run = _earlier_run(tmp_path)

    def refused(cfg: MetaTrainConfig) -> str:
        with pytest.raises(RunDirError) as caught:
            check_resumable(read_run(run), cfg)
        return str(caught.value)

    # A field added since, set now: the earlier run trained with its default.
    assert refused(_earlier_cfg(tmp_path, ["training.history_points=50"])) == (
        f"{run}: it was started with another config, which differs in "
        "training.history_points (run: 100, now: 50); resume it with that config or start a "
        "new run"
    )
    shutil.rmtree(run)
    # A field this release no longer reads, or a value it refuses.
    run = _earlier_run(tmp_path, {"training": {"old_knob": 3, "log_every": 0}})
    message = (
        "it was started by an offmeta whose config this one reads differently: "
        "training.log_every (run: 0, now: Input should be greater than or equal to 1), "
        "training.old_knob (run: 3, now: no such field); resume it with the offmeta that "
        "started it or start a new run"
    )
    assert refused(_earlier_cfg(tmp_path)) == f"{run}: {message}"
    with pytest.raises(RunDirError) as caught:
        find_resumable(_earlier_cfg(tmp_path))
    assert f"(unfinished runs of that name: {run}: {message});" in str(caught.value)
