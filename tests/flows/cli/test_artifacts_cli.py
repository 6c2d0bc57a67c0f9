"""``offmeta artifacts ...``: tables, --json, exit codes and error messages."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from flows.cli import artifacts as artifacts_cli
from pipeline.artifacts import ArtifactStore

pytestmark = pytest.mark.timeout(60)


def offmeta(*argv: str) -> int:
    """Run ``offmeta artifacts ARGV`` through the group's own ``register``."""
    parser = argparse.ArgumentParser(prog="offmeta")
    artifacts_cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["artifacts", *argv])
    return args.handler(args)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    store = ArtifactStore(tmp_path / "store", durable=False)
    params = {"default_policy": {"w": torch.ones(3, 2), "b": torch.zeros(3)}, "critic": {}}
    store.publish(
        "maml",
        params,
        metrics={"loss": 0.123456},
        config={"lr": 0.01},
        lineage={"dataset_fingerprint": "fp-1", "extras": {"restarts": 1}},
    )
    store.publish(
        "maml",
        params,
        metrics={"loss": 0.05},
        config={"lr": 0.01},
        lineage={"parent": "maml:1"},
        history={"loss": [1.0, 0.05]},
    )
    store.publish("other", params, metrics={}, config={}, lineage={})
    return store.root


def test_list_names_and_versions_as_tables(root, capsys):
    assert offmeta("list", "--root", str(root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "VERSIONS", "LATEST", "CREATED", "ALIASES"]
    assert [line.split()[:3] + line.split()[4:] for line in lines[1:]] == [
        ["maml", "2", "2", "latest=2"],
        ["other", "1", "1", "latest=1"],
    ]
    assert offmeta("list", "maml", "--root", str(root)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["VERSION", "CREATED", "PARAMS", "DIGEST", "ALIASES", "METRICS"]
    assert lines[1].split()[0] == "1" and lines[1].endswith("loss=0.1235")
    assert lines[2].split()[0] == "2" and lines[2].endswith("latest   loss=0.05")


def test_list_as_json(root, capsys):
    assert offmeta("list", "--root", str(root), "--json") == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(r["name"], r["versions"], r["latest"], r["aliases"]) for r in listed] == [
        ("maml", 2, 2, {"latest": 2}),
        ("other", 1, 1, {"latest": 1}),
    ]
    assert offmeta("list", "maml", "--root", str(root), "--json") == 0
    versions = json.loads(capsys.readouterr().out)
    store = ArtifactStore(root)
    assert [(v["spec"], v["digest"], v["aliases"]) for v in versions] == [
        ("maml:1", store.get("maml:1").params_digest, []),
        ("maml:2", store.get("maml:2").params_digest, ["latest"]),
    ]


def test_root_defaults_to_the_environment_variable(root, capsys, monkeypatch):
    monkeypatch.setenv("OFFMETA_ARTIFACTS", str(root))
    assert offmeta("list", "--json") == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["maml", "other"]


def test_show_prints_lineage_metrics_modules_and_files(root, capsys):
    assert offmeta("show", "maml:1", "--root", str(root)) == 0
    out = capsys.readouterr().out
    assert out.startswith("maml:1  (no aliases)\n")
    assert '  dataset_fingerprint: "fp-1"\n  restarts: 1\n' in out
    assert "metrics:\n  loss: 0.123456\n" in out
    assert 'config: {"lr": 0.01}\n' in out
    modules = out.split("modules:\n")[1].split("files:\n")[0].splitlines()
    assert [line.split() for line in modules] == [
        ["MODULE", "TENSORS", "ELEMENTS", "DTYPES"],
        ["critic", "0", "0", "-"],
        ["default_policy", "2", "9", "F32"],
    ]
    files = [line.split()[0] for line in out.split("files:\n")[1].splitlines()[1:]]
    assert files == ["config.json", "metrics.json", "params.safetensors"]


def test_show_lists_the_pictures_and_export_writes_them(root, tmp_path, capsys):
    assert offmeta("show", "maml:2", "--root", str(root)) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (
        "pictures: learning_curve.png (write them out: offmeta artifacts export maml:2 DIR)"
    )
    target = tmp_path / "exported"
    assert offmeta("export", "maml:2", str(target), "--root", str(root)) == 0
    store = ArtifactStore(root)
    for name in ("learning_curve.png", "learning_curve.json", "history.json"):
        assert (target / name).read_bytes() == store.read_file("maml:2", name), name
    assert json.loads((target / "learning_curve.json").read_text())["history"] == {
        "loss": [1.0, 0.05]
    }


def test_show_as_json_is_the_manifest_plus_ref(root, capsys):
    assert offmeta("show", "maml", "--root", str(root), "--json") == 0
    shown = json.loads(capsys.readouterr().out)
    store = ArtifactStore(root)
    assert shown["ref"] == "maml:2" and shown["aliases"] == ["latest"]
    assert shown["uri"] == store.resolve("maml").uri
    assert shown["lineage"]["parent"] == "maml:1"
    assert shown["files"]["params.safetensors"]["digest"] == store.resolve("maml").digest


def test_verify_reports_ok_and_failures_with_exit_status(root, capsys):
    assert offmeta("verify", "maml", "maml:1", "other", "--root", str(root)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "OK      maml:2  (6 files verified)",
        "OK      maml:1  (3 files verified)",
        "OK      other:1  (3 files verified)",
    ]
    manifest = ArtifactStore(root).get("maml:1")
    digest = manifest.files["metrics.json"].digest
    blob = root / "blobs" / "sha256" / digest[7:9] / digest[7:]
    blob.chmod(0o644)
    blob.write_bytes(b"{}")
    assert offmeta("verify", "maml:1", "maml:2", "--root", str(root)) == 1
    captured = capsys.readouterr()
    assert captured.out == "OK      maml:2  (6 files verified)\n"
    assert captured.err.startswith(
        f"FAILED  maml:1: maml:1 file 'metrics.json' (blob {blob}) is corrupt: "
        f"expected digest {digest}, found sha256:"
    )
    assert offmeta("verify", "maml:1", "--root", str(root), "--json") == 1
    (result,) = json.loads(capsys.readouterr().out)
    assert result["ok"] is False and "'metrics.json'" in result["error"]


def test_alias_moves_with_compare_and_swap(root, capsys):
    assert offmeta("alias", "maml", "prod", "1", "--root", str(root)) == 0
    assert capsys.readouterr().out == "maml@prod: (new) -> 1\n"
    assert offmeta("alias", "maml", "prod", "2", "--expected", "1", "--root", str(root)) == 0
    assert capsys.readouterr().out == "maml@prod: 1 -> 2\n"
    assert offmeta("alias", "maml", "prod", "1", "--expected", "1", "--root", str(root)) == 1
    assert capsys.readouterr().err == (
        "offmeta artifacts alias: error: refusing to move maml@prod to version 1: it points "
        "at version 2, but the caller expected it to point at version 1; re-read the alias "
        "and retry\n"
    )
    assert offmeta("alias", "maml", "latest", "1", "--root", str(root)) == 1
    assert "'latest' only moves forward" in capsys.readouterr().err
    assert offmeta("alias", "maml", "prod", "1", "--expected", "two", "--root", str(root)) == 1
    assert capsys.readouterr().err == (
        "offmeta artifacts alias: error: --expected must be a version number or 'none', got 'two'\n"
    )
    assert (
        offmeta("alias", "maml", "canary", "2", "--expected", "none", "--json", "--root", str(root))
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {
        "name": "maml",
        "alias": "canary",
        "version": 2,
        "previous": None,
    }
    assert ArtifactStore(root).aliases("maml") == {"canary": 2, "latest": 2, "prod": 2}


def test_export_writes_files_and_refuses_to_overwrite(root, tmp_path, capsys):
    target = tmp_path / "exported"
    assert offmeta("export", "maml@latest", str(target), "--root", str(root)) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"exported maml:2 to {target}:"
    tensors = load_file(str(target / "params.safetensors"))
    assert sorted(tensors) == ["default_policy/b", "default_policy/w"]
    assert json.loads((target / "manifest.json").read_text())["version"] == 2
    assert offmeta("export", "maml:1", str(target), "--root", str(root)) == 1
    assert capsys.readouterr().err.startswith(
        "offmeta artifacts export: error: refusing to overwrite config.json, metrics.json, "
        "params.safetensors, manifest.json in "
    )


def test_errors_exit_1_with_one_line_naming_the_problem(root, capsys):
    assert offmeta("show", "nope", "--root", str(root)) == 1
    assert capsys.readouterr().err == (
        f"offmeta artifacts show: error: no artifact named 'nope' in {root} "
        f"(artifacts: maml, other)\n"
    )
    assert offmeta("show", "maml:9", "--root", str(root)) == 1
    assert capsys.readouterr().err == (
        "offmeta artifacts show: error: artifact 'maml' has no version 9 (published: 1-2)\n"
    )
    assert offmeta("list", "../etc", "--root", str(root)) == 1
    assert capsys.readouterr().err.startswith(
        "offmeta artifacts list: error: artifact name '../etc' contains the path separator '/'"
    )
    assert offmeta("list", "--root", str(root / "missing")) == 0
    assert capsys.readouterr().out == f"no artifacts in {root / 'missing'}\n"


def test_gc_reports_what_it_removed(root, capsys):
    (root / "tmp" / "123-abc.part").write_bytes(b"left by a crash")
    assert offmeta("gc", "--root", str(root)) == 0
    assert capsys.readouterr().out == (
        "removed 1 staged files, 0 unreferenced blobs (0 B) and 0 stale idempotency records\n"
    )
    assert offmeta("gc", "--root", str(root), "--json") == 0
    assert json.loads(capsys.readouterr().out) == {
        "temp_files": 0,
        "blobs": 0,
        "freed_bytes": 0,
        "key_records": 0,
    }
