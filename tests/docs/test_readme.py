"""The README's examples run as written (docs that run): every ```python block runs, section by
section in a fresh temporary directory, and every ``offmeta run`` command in a ```bash block
names a valid config."""

from __future__ import annotations

import re
import shlex

import pytest

from tests.helpers.paths import REPO

ROOT = REPO
README = (ROOT / "README.md").read_text()


def _sections(markdown: str) -> dict[str, str]:
    """``## Title`` -> that section's text."""
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


PYTHON_SECTIONS = {
    title: blocks
    for title, text in _sections(README).items()
    if (blocks := _blocks(text, "python"))
}
RUN_COMMANDS = [
    shlex.split(line, comments=True)[2:]
    for block in _blocks(README, "bash")
    for line in block.replace("\\\n", " ").splitlines()
    if line.startswith("offmeta run ")
]


def test_the_readme_has_examples_to_run():
    assert {"Streams", "Learners", "Artifact store"} <= PYTHON_SECTIONS.keys()
    assert len(RUN_COMMANDS) >= 3


@pytest.mark.timeout(180)
@pytest.mark.parametrize("title", sorted(PYTHON_SECTIONS))
def test_python_examples_run(title, tmp_path, monkeypatch, ray_session):
    # A scratch working directory that still sees the shipped samples under data/.
    (tmp_path / "data").symlink_to(ROOT / "data")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in PYTHON_SECTIONS[title]:
        exec(compile(block, f"README.md ## {title}", "exec"), namespace)


@pytest.mark.parametrize("words", RUN_COMMANDS, ids=" ".join)
def test_run_commands_name_valid_configs(words):
    from flows.config import load_config

    config = words[words.index("--config") + 1]
    overrides = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    load_config(ROOT / config, overrides)
