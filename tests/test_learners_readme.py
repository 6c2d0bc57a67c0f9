"""The README's learners examples run as written (docs that run), and the package keeps its
boundary: importing it loads nothing from Ray, Prefect or `pipeline`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Learners"


def python_examples(markdown: str) -> list[str]:
    """The ```python blocks of the README's learners section, in order."""
    if SECTION not in markdown:
        return []
    section = markdown.split(SECTION, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)


@pytest.mark.timeout(120)
def test_readme_learners_examples_run():
    examples = python_examples(README.read_text())
    if not examples:
        pytest.skip(f"README.md has no {SECTION!r} section with a python example yet")
    namespace: dict[str, object] = {}
    for example in examples:
        exec(compile(example, str(README), "exec"), namespace)


def test_learners_import_nothing_from_ray_prefect_or_pipeline():
    probe = (
        "import sys, learners; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'prefect', 'pipeline'}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
