"""Docs that run: every code block of README.md and of the pages under docs/ is a test.

Page by page, in a fresh scratch directory that sees the repository's files but writes its
own, the blocks run in order: ```python blocks in one namespace (their asserts are their
expected output), ```bash blocks with ``bash -e`` and this checkout's ``offmeta`` first on
``PATH``. A ```bash block with ``<!-- not run: REASON -->`` on the line above is not run;
```text blocks are not code. Every ``offmeta run`` line, run or not, names a config that
loads with its overrides, and every ```yaml block is a run config fragment: laid over the
shipped point-robot config, it validates. The rules are in docs/development.md, "Docs that run".
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from tests.helpers.paths import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
LANGUAGES = {"python", "bash", "text", "yaml"}
# What the examples write stays in the scratch directory: these are not linked into it.
NOT_LINKED = {".git", "artifacts", "runs", "site", "build"}
MARKER = re.compile(r"<!-- not run: (.*?) -->")


class Block(NamedTuple):
    """One fenced code block of a page."""

    page: Path
    line: int
    language: str
    code: str
    not_run: str | None
    """The reason given in the marker above the block, or None when it runs."""


def page_blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` in order, with the marker above each, if any."""
    lines = page.read_text().splitlines()
    blocks = []
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            marker = MARKER.fullmatch(lines[index - 1]) if index else None
            code = "\n".join(lines[index + 1 : end]) + "\n"
            reason = marker.group(1).strip() if marker else None
            blocks.append(Block(page, index + 1, line[3:].strip(), code, reason))
            index = end
        index += 1
    return blocks


def _name(page: Path) -> str:
    return str(page.relative_to(REPO))


BLOCKS = {_name(page): page_blocks(page) for page in PAGES}
RUNNABLE = sorted(
    name
    for name, blocks in BLOCKS.items()
    if any(b.language == "python" or (b.language == "bash" and b.not_run is None) for b in blocks)
)
RUN_COMMANDS = [
    (f"{_name(block.page)}:{block.line}", shlex.split(line, comments=True)[2:])
    for blocks in BLOCKS.values()
    for block in blocks
    if block.language == "bash"
    for line in block.code.replace("\\\n", " ").splitlines()
    if line.startswith("offmeta run ") and "--help" not in line
]


def test_every_block_has_a_language_and_every_marker_a_reason_and_a_block():
    problems = [
        f"{_name(b.page)}:{b.line}: fence language {b.language!r}, expected one of "
        f"{sorted(LANGUAGES)}"
        for blocks in BLOCKS.values()
        for b in blocks
        if b.language not in LANGUAGES
    ]
    problems += [
        f"{_name(b.page)}:{b.line}: a not-run marker above a {b.language} block (only bash "
        "blocks run as commands; text blocks never run)"
        for blocks in BLOCKS.values()
        for b in blocks
        if b.not_run is not None and b.language != "bash"
    ]
    problems += [
        f"{_name(b.page)}:{b.line}: a not-run marker without a reason"
        for blocks in BLOCKS.values()
        for b in blocks
        if b.not_run == ""
    ]
    for page in PAGES:
        lines = page.read_text().splitlines()
        problems += [
            f"{_name(page)}:{i + 1}: a not-run marker that is not right above a fence"
            for i, line in enumerate(lines)
            if MARKER.fullmatch(line) and lines[i + 1 : i + 2] != ["```bash"]
        ]
    assert problems == []


def test_the_docs_have_examples_to_run():
    assert {"README.md", "docs/data-contract.md", "docs/streams.md", "docs/learners.md"} <= set(
        RUNNABLE
    )
    assert {"docs/macaw.md", "docs/artifacts.md", "docs/runs.md"} <= set(RUNNABLE)
    assert len(RUN_COMMANDS) >= 5


def _scratch(tmp_path: Path) -> Path:
    """A directory that sees every file of the repository through links, and writes its own."""
    for entry in REPO.iterdir():
        if entry.name not in NOT_LINKED and (
            entry.name == ".venv" or not entry.name.startswith(".")
        ):
            (tmp_path / entry.name).symlink_to(entry)
    return tmp_path


def _shell_environment() -> dict[str, str]:
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    environment["PYTHONPATH"] = str(REPO)
    environment.pop("OFFMETA_ARTIFACTS", None)
    return environment


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", RUNNABLE)
def test_page_examples_run(name, tmp_path, monkeypatch, ray_session):
    scratch = _scratch(tmp_path)
    monkeypatch.chdir(scratch)
    namespace: dict[str, object] = {"__name__": "docs"}
    tracking_uri = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        _run_blocks(name, scratch, namespace)
    finally:
        # A page may set MLflow's process-wide tracking URI (mlflow.set_tracking_uri, as its
        # users do); the tests after it must not inherit it. None unsets it.
        if "mlflow" in sys.modules:
            sys.modules["mlflow"].set_tracking_uri(tracking_uri)


def _run_blocks(name: str, scratch: Path, namespace: dict[str, object]) -> None:
    for block in BLOCKS[name]:
        where = f"{name}:{block.line}"
        if block.language == "python":
            exec(compile(block.code, where, "exec"), namespace)
        elif block.language == "bash" and block.not_run is None:
            result = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", block.code],
                cwd=scratch,
                env=_shell_environment(),
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert result.returncode == 0, f"{where} exited {result.returncode}:\n{result.stderr}"


YAML_BLOCKS = [block for blocks in BLOCKS.values() for block in blocks if block.language == "yaml"]


@pytest.mark.parametrize(
    "block", YAML_BLOCKS, ids=[f"{_name(b.page)}:{b.line}" for b in YAML_BLOCKS]
)
def test_yaml_blocks_are_valid_run_config_fragments(block):
    import yaml

    from flows.config import validate_config

    document = yaml.safe_load((REPO / "flows" / "configs" / "point_robot.yaml").read_text())
    fragment = yaml.safe_load(block.code)
    for section, values in fragment.items():
        document[section] = {**document.get(section, {}), **values}
    validate_config(document, source=f"{_name(block.page)}:{block.line}")


@pytest.mark.parametrize(("where", "words"), RUN_COMMANDS, ids=[w for w, _ in RUN_COMMANDS])
def test_run_commands_name_valid_configs(where, words):
    from flows.config import load_config

    config = words[words.index("--config") + 1]
    overrides = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    load_config(REPO / config, overrides)
