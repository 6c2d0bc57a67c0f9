"""Every Python example in data/README.md runs (its asserts are its expected output)."""

from __future__ import annotations

import re

import pytest

from tests.helpers.paths import REPO

README = REPO / "data" / "README.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_readme_has_examples():
    assert EXAMPLES


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index, ray_session):
    exec(compile(EXAMPLES[index], f"{README}:example{index}", "exec"), {"__name__": "readme"})
