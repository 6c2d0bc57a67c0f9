"""The docs site builds: ``mkdocs build --strict`` (a warning fails it: a broken link or
anchor, a page outside the navigation, a docstring mkdocstrings cannot render) with this
environment's mkdocs, offline."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.paths import REPO


@pytest.mark.timeout(180)
def test_the_site_builds_strictly(tmp_path):
    mkdocs = Path(sys.executable).parent / "mkdocs"
    environment = dict(os.environ, PYTHONPATH=str(REPO), NO_MKDOCS_2_WARNING="1")
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr
    built = {path.relative_to(tmp_path / "site").as_posix() for path in tmp_path.rglob("*.html")}
    pages = {
        "index.html"
        if page.name == "index.md"
        else f"{page.relative_to(REPO / 'docs').with_suffix('')}/index.html"
        for page in (REPO / "docs").rglob("*.md")
    }
    assert pages <= built
    # The API reference is rendered from the docstrings, not left as `::: module` lines.
    api = (tmp_path / "site" / "api" / "pipeline" / "index.html").read_text()
    assert 'id="pipeline.reads.episodes.read_episodes"' in api
    assert ":::" not in api
