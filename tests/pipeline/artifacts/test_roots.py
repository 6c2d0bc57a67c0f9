"""Store roots: directories, file:// and s3:// are accepted; anything else is refused by
name before a byte is written (also in a run config)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flows.cli import main
from flows.config import ConfigError, validate_config
from pipeline.artifacts import (
    ArtifactError,
    ArtifactStore,
    S3Root,
    UnsupportedRootError,
    parse_root,
)
from tests.helpers.flow_runs import tiny_document
from tests.helpers.paths import REPO

SUPPORTED = "a directory path, a file:// URI or s3://bucket/prefix"
REPO = REPO
POINT_ROBOT = REPO / "flows" / "configs" / "point_robot.yaml"
OFFMETA = str(Path(sys.executable).with_name("offmeta"))
GS_REFUSED = (
    "artifact store root 'gs://bucket/prefix' has the scheme 'gs://', which the store cannot "
    f"write to; expected {SUPPORTED}"
)


def test_accepted_roots(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse_root("artifacts") == tmp_path / "artifacts"
    assert parse_root(tmp_path / "store") == tmp_path / "store"
    assert parse_root(f"file://{tmp_path}/store") == tmp_path / "store"
    assert parse_root(f"file://localhost{tmp_path}/my%20store") == tmp_path / "my store"
    assert parse_root("s3://models/offmeta/prod/") == S3Root("models", "offmeta/prod")
    assert parse_root("s3://models") == S3Root("models", "")
    assert str(S3Root("models", "offmeta/prod")) == "s3://models/offmeta/prod"
    # A path object is a path even when its text looks like a URI; later colons are plain.
    assert parse_root(Path("s3:") / "bucket") == tmp_path / "s3:" / "bucket"
    assert parse_root("runs/a:b") == tmp_path / "runs" / "a:b"


@pytest.mark.parametrize(
    ("root", "message"),
    [
        (
            "gs://models/offmeta",
            "artifact store root 'gs://models/offmeta' has the scheme 'gs://', which the store "
            f"cannot write to; expected {SUPPORTED}",
        ),
        (
            "HTTP://example.com/x",
            "artifact store root 'HTTP://example.com/x' has the scheme 'http://', which the "
            f"store cannot write to; expected {SUPPORTED}",
        ),
        (
            "s3://Models_2/offmeta",
            "artifact store root 's3://Models_2/offmeta' names the bucket 'Models_2', which is "
            "not a valid S3 bucket name (3-63 lowercase letters, digits, '.' and '-'); "
            "expected s3://bucket/prefix",
        ),
        (
            "s3:///offmeta",
            "artifact store root 's3:///offmeta' names the bucket '', which is not a valid S3 "
            "bucket name (3-63 lowercase letters, digits, '.' and '-'); "
            "expected s3://bucket/prefix",
        ),
        (
            "s3://models/a//b",
            "artifact store root 's3://models/a//b' has the prefix 'a//b', with an empty, '.' "
            "or '..' segment or a control character; expected s3://bucket/some/prefix",
        ),
        (
            "s3://models/a/../b",
            "artifact store root 's3://models/a/../b' has the prefix 'a/../b', with an empty, "
            "'.' or '..' segment or a control character; expected s3://bucket/some/prefix",
        ),
        (
            "file://server/share/store",
            "artifact store root 'file://server/share/store' names the host 'server'; a "
            "file:// root must be local (file:///absolute/path)",
        ),
        (
            "",
            f"artifact store root must be a non-empty string or path, got ''; expected {SUPPORTED}",
        ),
    ],
)
def test_refused_roots_name_the_root_and_what_is_accepted(root, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedRootError) as raised:
        parse_root(root)
    assert str(raised.value) == message
    with pytest.raises(ArtifactError, match=r"^artifact store root"):
        ArtifactStore(root)
    assert list(tmp_path.iterdir()) == []  # no folder named 'gs:' or anything else


def test_a_file_uri_and_a_path_open_the_same_store(tmp_path):
    by_path = ArtifactStore(tmp_path / "store", durable=False)
    ref = by_path.publish("m", {"p": {"w": torch.ones(2)}}, metrics={}, config={}, lineage={})
    by_uri = ArtifactStore((tmp_path / "store").as_uri())
    assert by_uri.root == by_path.root == tmp_path / "store"
    assert by_uri.resolve("m@latest") == ref
    assert ref.uri == (tmp_path / "store" / "names/m/versions/00000001.json").as_uri()


def test_a_run_config_accepts_s3_roots_and_refuses_other_schemes(tmp_path):
    document = tiny_document(Path("data"), tmp_path, ["artifacts.root=s3://models/offmeta"])
    assert validate_config(document).artifacts.root == "s3://models/offmeta"
    refused = tiny_document(Path("data"), tmp_path, ["artifacts.root=gs://models/offmeta"])
    with pytest.raises(ConfigError) as raised:
        validate_config(refused)
    assert str(raised.value) == (
        "invalid config config (1 error):\n"
        "  artifacts.root: artifact store root 'gs://models/offmeta' has the scheme 'gs://', "
        f"which the store cannot write to; expected {SUPPORTED}"
    )


def test_offmeta_run_refuses_such_a_root_as_an_invalid_config(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    status = main(
        ["run", "--config", str(POINT_ROBOT), "--set", "artifacts.root=gs://bucket/prefix"]
    )
    assert status == 2  # as for every invalid config: nothing ran
    assert capsys.readouterr().err == (
        f"offmeta run: invalid config {POINT_ROBOT} (1 error):\n  artifacts.root: {GS_REFUSED}\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["list", "gc"])
def test_the_cli_refuses_such_a_root_in_one_line_and_writes_nothing(
    command: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [OFFMETA, "artifacts", command, "--root", "gs://bucket/prefix"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"offmeta artifacts {command}: error: {GS_REFUSED}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_cli_accepts_a_file_uri_root(tmp_path: Path) -> None:
    ArtifactStore(tmp_path / "store", durable=False).publish(
        "maml", {"p": {"w": torch.ones(2)}}, metrics={}, config={}, lineage={}
    )
    done = subprocess.run(
        [OFFMETA, "artifacts", "list", "--root", (tmp_path / "store").as_uri()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert [line.split()[:3] for line in done.stdout.splitlines()] == [
        ["NAME", "VERSIONS", "LATEST"],
        ["maml", "1", "1"],
    ]
