"""Which tier a test file belongs to, read from its source: the rule behind ``make test``
(the quick tier) and ``make test-system`` (tests marked ``pytest.mark.system``).

A file is in exactly one tier: either the module is marked (``pytestmark``) or every test in
it is, or none is. A file that shows a sign of needing a multi-process system (below) must be
in the system tier; a file may join it without a sign (a long training run, a process whose
start the source does not show), marked by hand. The signs are names the file uses, read with
``ast`` (a word in a comment or a string is no sign).
"""

from __future__ import annotations

import ast
from pathlib import Path

SIGNS = {
    "tests.helpers.ray_cluster": "starts a Ray cluster",
    "tests.helpers.cluster_runs": "runs offmeta on a Ray cluster",
    "tests.helpers.offmeta_process": "runs offmeta in a process of its own",
    "moto_server": "starts an S3 server of its own",
    "mlflow_server": "starts an MLflow server of its own",
    "WorkerFault": "kills a Ray Train worker",
    "Popen": "starts a process that outlives a call (a server, a process to kill)",
    "SIGKILL": "kills a process",
    "kill": "kills a process",
    "killpg": "kills a process group",
}
"""Name used -> what it shows the file needs. The session's shared Ray, Prefect harness, S3
and MLflow servers (``tests/conftest.py``) are no sign: one of each serves the whole run."""

MARK = "system"


def tier_problems(path: str, source: str) -> list[str]:
    """One line per way the file at ``path`` (its ``source``) breaks the tier rule."""
    tree = ast.parse(source, filename=path)
    tiers = _test_tiers(tree)
    if len(set(tiers.values())) > 1:
        quick = sorted(name for name, tier in tiers.items() if tier == "quick")
        return [
            f"{path}: {', '.join(quick)} quick, the other tests system; a file is in one "
            f"tier: mark the module (pytestmark = pytest.mark.{MARK}) or move the system "
            "tests to a file of their own"
        ]
    shown = signs(tree)
    if shown and set(tiers.values()) == {"quick"}:
        needs = "; ".join(f"{SIGNS[sign]} ({sign})" for sign in shown)
        return [
            f"{path}: {needs}; but it is in the quick tier: mark the module "
            f"(pytestmark = pytest.mark.{MARK})"
        ]
    return []


def file_tier(source: str) -> str:
    """``system`` or ``quick``: the tier of the tests in a file that keeps the rule."""
    return "system" if "system" in _test_tiers(ast.parse(source)).values() else "quick"


def signs(tree: ast.Module) -> list[str]:
    """The signs (keys of ``SIGNS``) the module uses, in ``SIGNS`` order."""
    used: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            used.add(node.module)
            used.update(f"{node.module}.{alias.name}" for alias in node.names)
            used.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            used.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
    return [sign for sign in SIGNS if sign in used]


def suite_files(root: Path) -> list[Path]:
    """Every pytest file under ``root``, sorted."""
    return sorted(root.rglob("test_*.py"))


def _test_tiers(tree: ast.Module) -> dict[str, str]:
    """Test function (``Class.test`` for methods) -> ``system`` or ``quick``."""
    module_marked = any(
        _marks(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
    )
    tiers = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            tiers[node.name] = _tier(module_marked or _decorated(node))
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for method in node.body:
                if isinstance(method, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    method.name.startswith("test")
                ):
                    marked = module_marked or _decorated(node) or _decorated(method)
                    tiers[f"{node.name}.{method.name}"] = _tier(marked)
    return tiers


def _decorated(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> bool:
    return any(_marks(decorator) for decorator in node.decorator_list)


def _marks(value: ast.expr) -> bool:
    """Whether ``value`` (a decorator, or what ``pytestmark`` is set to) is or holds
    ``pytest.mark.system``."""
    return any(
        isinstance(node, ast.Attribute)
        and node.attr == MARK
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        for node in ast.walk(value)
    )


def _tier(marked: bool) -> str:
    return "system" if marked else "quick"
