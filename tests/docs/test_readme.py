"""README.md is the front page: under 12 KB, its commands first (the quick tests before the
system tests), and every link to the docs lands on a page and, where it names one, a heading
anchor of that page. Its code blocks run with the docs' (tests/docs/test_examples.py)."""

from __future__ import annotations

import re

from tests.helpers.paths import REPO

README = REPO / "README.md"
LIMIT_BYTES = 12_288


def test_the_readme_stays_a_front_page():
    assert len(README.read_bytes()) <= LIMIT_BYTES


def test_the_readme_starts_with_its_commands_the_quick_tests_first():
    text = README.read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.DOTALL)
    assert first_block is not None
    assert text.index("```bash") < text.index("\n## ")
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make run", "make test", "make test-system"]  # the quick tier first


def _anchors(page: str) -> set[str]:
    return set(re.findall(r"^#+ .*\{#([^}]+)\}\s*$", page, flags=re.MULTILINE))


def test_the_readme_links_land_on_docs_pages_and_their_anchors():
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]+))?\)", README.read_text())
    assert len(links) >= 10
    missing = [
        f"{path}#{anchor}" if anchor else path
        for path, anchor in links
        if not (REPO / path).is_file()
        or (anchor and anchor not in _anchors((REPO / path).read_text()))
    ]
    assert missing == []
