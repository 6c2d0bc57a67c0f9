"""docs/mlflow.md runs as written: its Python example (publish, mirror to a local SQLite
tracking store, predict through MLflow and through offmeta) in a fresh working directory."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PAGE = REPO / "docs" / "mlflow.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def test_the_page_has_an_example() -> None:
    assert len(EXAMPLES) == 1


@pytest.mark.timeout(180)
def test_the_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(EXAMPLES[0], f"{PAGE}:example0", "exec"), {"__name__": "docs"})
    assert (tmp_path / "mlflow.db").is_file()
