"""How ``make test`` shares files between its test processes (pytest-xdist, ``--dist
loadfile``): file by file, except that the files using the session's MLflow server run in one
process, one after another, so that one server (a start of 10-60 s, by the machine's load)
serves them all instead of one per process. Read from each file's source, as the tiers are
(``tests/helpers/tiers.py``): a file uses the server when it names the fixture."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

from xdist.scheduler import LoadFileScheduling

SERVER_FIXTURES = {"mlflow_tracking": "the session's MLflow server"}
"""Fixture -> the scope the files that use it share."""


class SharedServerScheduling(LoadFileScheduling):
    """``LoadFileScheduling`` whose scope for a file using a server fixture is the server."""

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return server_scope(Path(self.config.rootpath, path)) or path


@cache
def server_scope(path: Path) -> str | None:
    """The scope of the server fixture the file at ``path`` uses (None: none)."""
    try:
        tree = ast.parse(path.read_text(), filename=str(path))
    except (OSError, SyntaxError):
        return None
    for node in ast.walk(tree):
        name = node.arg if isinstance(node, ast.arg) else getattr(node, "id", None)
        if name in SERVER_FIXTURES:
            return SERVER_FIXTURES[name]
    return None
