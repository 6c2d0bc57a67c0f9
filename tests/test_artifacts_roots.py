"""Store roots: plain paths and file:// URIs name the same local directory; any other scheme
is refused by the store, the config and the CLI, and nothing is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flows.cli import main
from flows.config import ConfigError, load_config
from pipeline.artifacts import ArtifactStore, UnsupportedRootError, local_root

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[1]
POINT_ROBOT = REPO / "flows" / "configs" / "point_robot.yaml"
OFFMETA = str(Path(sys.executable).with_name("offmeta"))
S3_REFUSED = (
    "artifact store root 's3://bucket/prefix': scheme 's3' is not supported; expected a local "
    "directory: a path, or a file:// URI such as file:///srv/artifacts"
)


def _publish(store: ArtifactStore) -> str:
    params = {"default_policy": {"w": torch.ones(2, 2)}}
    return str(store.publish("maml", params, metrics={}, config={}, lineage={}))


def test_paths_and_file_uris_name_the_same_directory(tmp_path: Path, monkeypatch) -> None:
    spaced = tmp_path / "my store"
    monkeypatch.chdir(tmp_path)
    assert local_root("my store") == spaced
    assert local_root(spaced) == spaced
    assert local_root(spaced.as_uri()) == spaced  # file:///.../my%20store
    assert local_root(f"file://localhost{spaced.as_uri().removeprefix('file://')}") == spaced
    assert local_root(f"FILE://LOCALHOST{spaced.as_uri().removeprefix('file://')}") == spaced
    # A path object is a path even when its text looks like a URI.
    assert local_root(Path("s3:") / "bucket") == tmp_path / "s3:" / "bucket"
    # Colons after the first path component are ordinary characters.
    assert local_root("runs/a:b") == tmp_path / "runs" / "a:b"


def test_a_store_opened_by_its_file_uri_reads_what_was_published(tmp_path: Path) -> None:
    published = _publish(ArtifactStore(tmp_path / "store", durable=False))
    reopened = ArtifactStore((tmp_path / "store").as_uri())
    assert reopened.root == tmp_path / "store"
    assert str(reopened.resolve("maml@latest")) == published


@pytest.mark.parametrize(
    ("root", "message"),
    [
        ("s3://bucket/prefix", S3_REFUSED),
        (
            "runs:nightly",
            "artifact store root 'runs:nightly': scheme 'runs' is not supported; expected a local "
            "directory: a path, or a file:// URI such as file:///srv/artifacts (for a directory "
            "of that name, write ./runs:nightly)",
        ),
        (
            "file://server/share/artifacts",
            "artifact store root 'file://server/share/artifacts': host 'server' is not this "
            "machine; expected file:///absolute/path or file://localhost/absolute/path (mount a "
            "shared directory and give its local path)",
        ),
        (
            "file:artifacts",
            "artifact store root 'file:artifacts': a file:// URI needs an absolute path, e.g. "
            "file:///srv/artifacts; write a relative directory as a plain path",
        ),
        (
            "file:///srv/a?b",
            "artifact store root 'file:///srv/a?b': a file:// URI names a directory and takes no "
            "query or fragment; percent-encode '?' and '#' in directory names (%3F, %23)",
        ),
        (
            "  ",
            "artifact store root is empty; expected a local directory: a path, or a file:// URI "
            "such as file:///srv/artifacts",
        ),
    ],
)
def test_roots_that_name_no_local_directory_are_refused(
    root: str, message: str, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UnsupportedRootError) as caught:
        ArtifactStore(root)
    assert str(caught.value) == message
    assert list(tmp_path.iterdir()) == []


def test_the_config_refuses_such_a_root_naming_the_field() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(POINT_ROBOT, ["artifacts.root=s3://bucket/prefix"])
    assert str(caught.value) == (
        f"invalid config {POINT_ROBOT} (1 error):\n  artifacts.root: {S3_REFUSED}"
    )
    uri = "file:///srv/artifacts"
    assert load_config(POINT_ROBOT, [f"artifacts.root={uri}"]).artifacts.root == uri


def test_offmeta_run_refuses_such_a_root_as_an_invalid_config(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    status = main(
        ["run", "--config", str(POINT_ROBOT), "--set", "artifacts.root=s3://bucket/prefix"]
    )
    assert status == 2  # as for every invalid config: nothing ran
    assert capsys.readouterr().err == (
        f"offmeta run: invalid config {POINT_ROBOT} (1 error):\n  artifacts.root: {S3_REFUSED}\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["list", "gc"])
def test_the_cli_refuses_such_a_root_in_one_line_and_writes_nothing(
    command: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [OFFMETA, "artifacts", command, "--root", "s3://bucket/prefix"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == f"offmeta artifacts {command}: error: {S3_REFUSED}\n"
    assert list(tmp_path.iterdir()) == []


def test_the_cli_accepts_a_file_uri_root(tmp_path: Path) -> None:
    _publish(ArtifactStore(tmp_path / "store", durable=False))
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
