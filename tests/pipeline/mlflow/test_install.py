"""The mirror is optional: the core install and every module outside ``pipeline.mlflow`` work
without mlflow; ``offmeta[mlflow]`` brings the client only, and the test extra the server's own
dependencies rather than the ``mlflow`` package (which would pin pyarrow below 26)."""

from __future__ import annotations

import re
import tomllib

from tests.helpers.fresh_python import fresh_python
from tests.helpers.paths import REPO


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=~!; ]", req, maxsplit=1)[0].lower() for req in requirements}


def test_mlflow_is_an_extra_and_the_core_install_is_free_of_it() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = {name: _names(reqs) for name, reqs in project["optional-dependencies"].items()}
    assert _names(project["dependencies"]).isdisjoint({"mlflow", "mlflow-skinny"})
    assert "mlflow-skinny" in extras["mlflow"]
    assert "mlflow" not in extras["mlflow"] | extras["test"] | extras["train"]
    assert {"mlflow-skinny", "sqlalchemy", "alembic", "flask"} <= extras["test"]


def test_nothing_outside_pipeline_mlflow_imports_mlflow() -> None:
    probe = (
        "import sys\n"
        "import pipeline.consumer, pipeline.artifacts, flows.config, flows.meta_train\n"
        "import flows.cli.artifacts, flows.stages.mirroring, pipeline.mlflow\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'mlflow'))"
    )
    assert fresh_python(probe) == "[]"
