"""How ``make test`` shares files between its processes (``tests/helpers/scheduling.py``): file
by file, the files that use the session's MLflow server as one scope."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.paths import REPO
from tests.helpers.scheduling import server_scope
from tests.helpers.tiers import suite_files

USES = """
def test_mirror(mlflow_tracking, tmp_path):
    assert mlflow_tracking.uri
"""
MENTIONS = '''
"""Not the mlflow_tracking fixture: a word in a docstring."""
def test_other(tmp_path):
    assert "mlflow_tracking"
'''


def test_a_file_that_takes_the_server_fixture_is_in_the_server_s_scope(tmp_path: Path) -> None:
    (tmp_path / "test_uses.py").write_text(USES)
    (tmp_path / "test_mentions.py").write_text(MENTIONS)
    assert server_scope(tmp_path / "test_uses.py") == "the session's MLflow server"
    assert server_scope(tmp_path / "test_mentions.py") is None


def test_the_suite_s_mlflow_files_share_one_scope_and_others_keep_their_own() -> None:
    scopes = {path: server_scope(path) for path in suite_files(REPO / "tests")}
    shared = [path for path, scope in scopes.items() if scope is not None]
    assert REPO / "tests/pipeline/mlflow/test_pyfunc_model.py" in shared
    assert REPO / "tests/flows/test_mlflow_mirror.py" in shared
    assert scopes[REPO / "tests/learners/meta/test_learner.py"] is None
