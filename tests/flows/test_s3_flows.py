"""A run with ``artifacts.root: s3://...``: the flow's stages publish there, a warm start
reads from there, and the Prefect link shows the s3:// URI and a consumer one-liner that
runs as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import prefect.artifacts
import pytest
import torch

from flows.meta_train import evaluate_learner, publish_result, train_learner, validate_dataset
from flows.stages.publishing import consumer_snippet, show_in_prefect
from pipeline.artifacts import ArtifactStore
from tests.helpers.flow_runs import tiny_config, tiny_point_robot
from tests.helpers.paths import REPO

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(240)]
REPO = REPO


def test_a_run_publishes_to_s3_and_the_next_one_warm_starts_from_it(
    s3_root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tiny_point_robot(tmp_path / "point_robot")
    cfg = tiny_config(data, tmp_path, [f"artifacts.root={s3_root}"])
    datasets = validate_dataset.fn(cfg)
    trained = train_learner.fn(cfg, datasets, str(tmp_path / "runs" / "first"))
    report = evaluate_learner.fn(cfg, trained, datasets)
    ref = publish_result.fn(cfg, trained, report, datasets, "first")
    assert str(ref) == "tiny-robot:1"
    assert ref.uri == f"{s3_root}/names/tiny-robot/versions/00000001.json"
    store = ArtifactStore(s3_root)
    assert store.verify(ref).config == cfg.model_dump(mode="json")

    # The Prefect link goes to the s3:// manifest and says how to load the version.
    links: list[dict[str, str]] = []
    monkeypatch.setattr(prefect.artifacts, "create_link_artifact", lambda **kw: links.append(kw))
    monkeypatch.setattr(prefect.artifacts, "create_table_artifact", lambda **kw: None)
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact", lambda **kw: None)
    show_in_prefect(ref, cfg.artifacts.root, trained, report)
    snippet = consumer_snippet(ref, cfg.artifacts.root)
    assert snippet == (
        "from pipeline.artifacts import ArtifactStore; "
        f"params = ArtifactStore({s3_root!r}).load_params('tiny-robot:1')"
    )
    (link,) = links
    assert link["link"] == ref.uri
    assert link["description"] == (
        f"Published version tiny-robot:1 in the artifact store {s3_root}; load it with `{snippet}`"
    )

    # The one-liner runs as written in a fresh process (endpoint from the AWS variables).
    check = f"{snippet}; print(params['default_policy']['layers.0.weight'].sum().item())"
    loaded = subprocess.run(
        [sys.executable, "-c", check],
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loaded.returncode == 0, loaded.stderr
    published = store.load_params(ref)["default_policy"]["layers.0.weight"]
    assert float(loaded.stdout) == published.sum().item()

    # The next run warm-starts from <name>@latest on S3 and records it as its parent.
    warm = tiny_config(
        data, tmp_path / "warm", [f"artifacts.root={s3_root}", "training.warm_start=true"]
    )
    again = train_learner.fn(warm, datasets, str(tmp_path / "runs" / "second"))
    assert again.parent == "tiny-robot:1"
    second = publish_result.fn(
        warm, again, evaluate_learner.fn(warm, again, datasets), datasets, "second"
    )
    assert str(second) == "tiny-robot:2"
    assert [m.spec for m in store.lineage(second)] == ["tiny-robot:2", "tiny-robot:1"]
    trained_further = store.load_params(second)["default_policy"]["layers.0.weight"]
    assert not torch.equal(trained_further, published)
