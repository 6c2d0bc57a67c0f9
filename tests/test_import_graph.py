"""The project's modules import each other without cycles.

Every import statement counts: at the top of a module, inside functions, and under
``TYPE_CHECKING``. A package's ``__init__`` is a module of its own (``pipeline.artifacts``),
so ``from pipeline.artifacts import layout`` is an arrow to the package *and* to
``pipeline.artifacts.layout``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

from tests.helpers.paths import REPO

PACKAGES = ("pipeline", "learners", "flows")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, set[str]]:
    """module -> the project's modules it names in any import statement."""
    paths = {
        module_name(path, root): path
        for package in packages
        for path in sorted((root / package).rglob("*.py"))
    }
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                base = _absolute(node, name, is_package)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            found |= {target for target in targets if target in paths and target != name}
        graph[name] = found
    return graph


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle as ``[a, b, ..., a]``, or ``None`` when the graph has none."""
    done: set[str] = set()
    on_path: list[str] = []

    def visit(node: str) -> list[str] | None:
        if node in on_path:
            return [*on_path[on_path.index(node) :], node]
        if node in done:
            return None
        on_path.append(node)
        for target in sorted(graph.get(node, ())):
            if (cycle := visit(target)) is not None:
                return cycle
        on_path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        if (cycle := visit(start)) is not None:
            return cycle
    return None


def test_the_project_has_no_import_cycle():
    graph = import_graph(REPO)
    assert len(graph) > 100  # all three packages were read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize(
    ("sources", "cycle"),
    [
        # a function-level import closes the circle
        (
            {"a/__init__.py": "", "a/x.py": "import a.y\n", "a/y.py": "def f():\n    import a.x\n"},
            ["a.x", "a.y", "a.x"],
        ),
        # an import under TYPE_CHECKING counts
        (
            {
                "a/__init__.py": "",
                "a/x.py": "from a.y import Y\n",
                "a/y.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                "    from a.x import X\n",
            },
            ["a.x", "a.y", "a.x"],
        ),
        # a package __init__ is a module: importing a sibling through it closes the circle
        (
            {"a/__init__.py": "from a.x import X\n", "a/x.py": "from a import y\n", "a/y.py": ""},
            ["a", "a.x", "a"],
        ),
        # relative imports resolve like absolute ones
        (
            {"a/__init__.py": "", "a/x.py": "from . import y\n", "a/y.py": "from .x import X\n"},
            ["a.x", "a.y", "a.x"],
        ),
        # one way only: no cycle
        ({"a/__init__.py": "", "a/x.py": "import a.y\n", "a/y.py": "import os\n"}, None),
    ],
)
def test_the_cycle_check_sees_every_kind_of_import(tmp_path, sources, cycle):
    for relative, text in sources.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text)
    graph = import_graph(tmp_path, ("a",))
    assert find_cycle(graph) == cycle
