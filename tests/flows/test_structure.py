"""The ``flows`` package imports without cycles: every module, and every import inside a
function, points one way (the flow chooses in-process or Ray Train training; neither
training stage imports the other's caller)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.paths import REPO

FLOWS = REPO / "flows"


def _module_name(path: Path) -> str:
    parts = path.relative_to(FLOWS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """flows module -> the flows modules it imports, at the top or inside functions."""
    modules = {_module_name(path): path for path in FLOWS.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            found |= {target for target in targets if target in modules and target != name}
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done:
            return None
        for target in sorted(graph[node]):
            if (found := visit(target, [*path, node])) is not None:
                return found
        done.add(node)
        return None

    for start in sorted(graph):
        if (found := visit(start, [])) is not None:
            return found
    return None


def test_flows_modules_import_each_other_without_cycles():
    graph = _imports()
    assert "flows.scale_out.driver" in graph["flows.scale_out"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_flow_chooses_where_to_train():
    graph = _imports()
    assert "flows.scale_out" not in graph["flows.stages.train"]
    assert {"flows.stages.train", "flows.scale_out"} <= graph["flows.meta_train"]
