"""The README's artifact-store example runs as written (docs that run)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Artifact store"


def python_examples(markdown: str) -> list[str]:
    """The ```python blocks of the README's artifact-store section, in order."""
    if SECTION not in markdown:
        return []
    section = markdown.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.mark.timeout(60)
def test_readme_artifact_store_example_runs(tmp_path, monkeypatch):
    examples = python_examples(README.read_text())
    if not examples:
        pytest.skip(f"README.md has no {SECTION!r} section with a python example yet")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    for example in examples:
        exec(compile(example, str(README), "exec"), namespace)
    assert (tmp_path / "artifacts" / "names" / "sinusoid-maml" / "versions").is_dir()
