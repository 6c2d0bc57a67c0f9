"""``pip install offmeta`` (no extras) is enough for a consumer: the artifact store, its CLI
and the learners load without Ray, Prefect or pyarrow; training commands say which extra
they need. Checked in fresh processes where those packages cannot be imported."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest
import torch

from pipeline.artifacts import ArtifactStore
from tests.helpers.paths import REPO

pytestmark = pytest.mark.timeout(120)
REPO = REPO
TRAINING = ("ray", "prefect", "pyarrow")
# Runs the offmeta CLI with the training packages made unimportable, as in a light install.
_WITHOUT_TRAINING = textwrap.dedent(
    """
    import importlib.abc, sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {"ray", "prefect", "pyarrow"}:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())
    from flows.cli import main
    code = main(sys.argv[1:])
    loaded = sorted({m.split(".")[0] for m in sys.modules} & {"ray", "prefect", "pyarrow"})
    assert not loaded, loaded
    sys.exit(code)
    """
)


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=100,
    )


def test_importing_the_store_and_the_learners_loads_neither_ray_nor_prefect():
    probe = (
        "import sys, pipeline.artifacts, learners, flows.cli.artifacts\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ray', 'prefect', 'pyarrow'}))"
    )
    result = _python("-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_artifacts_cli_and_loading_work_without_the_training_packages(tmp_path):
    store = ArtifactStore(tmp_path / "store", durable=False)
    weight = torch.arange(6.0).reshape(2, 3)
    store.publish("policy", {"default_policy": {"w": weight}}, metrics={}, config={}, lineage={})
    root = str(tmp_path / "store")
    listed = _python("-c", _WITHOUT_TRAINING, "artifacts", "list", "--root", root)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:3] == ["policy", "1", "1"]
    verified = _python("-c", _WITHOUT_TRAINING, "artifacts", "verify", "policy", "--root", root)
    assert verified.stdout == "OK      policy:1  (3 files verified)\n", verified.stderr
    load = (
        _WITHOUT_TRAINING.replace("from flows.cli import main\n", "")
        .replace("code = main(sys.argv[1:])", "")
        .replace("sys.exit(code)", "")
        + "import learners\nfrom pipeline.artifacts import ArtifactStore\n"
        + f"params = ArtifactStore({root!r}).load_params('policy@latest')\n"
        + "print(params['default_policy']['w'].sum().item())\n"
    )
    loaded = _python("-c", load)
    assert loaded.returncode == 0, loaded.stderr
    assert float(loaded.stdout) == weight.sum().item()


def test_training_commands_name_the_extra_they_need():
    config = str(REPO / "flows" / "configs" / "point_robot.yaml")
    # The data check before the run reads footers with pyarrow, the first training package.
    result = _python("-c", _WITHOUT_TRAINING, "run", "--config", config)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == (
        "offmeta run: error: this command needs the training extra, and 'pyarrow' is not "
        "installed; install it with: pip install 'offmeta[train]'"
    )


def test_ray_and_prefect_are_in_the_train_extra_not_the_core_install():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[\[<>=~!; ]", req, maxsplit=1)[0] for req in requirements}

    core = names(project["dependencies"])
    extras = {extra: names(reqs) for extra, reqs in project["optional-dependencies"].items()}
    assert core.isdisjoint(TRAINING)
    assert {"torch", "safetensors", "pydantic", "boto3"} <= core
    assert set(TRAINING) <= extras["train"]
    assert "moto" in extras["test"]
    makefile = (REPO / "Makefile").read_text()
    assert "pip install --quiet -e '.[train,test]'" in makefile


def test_the_artifacts_commands_import_only_their_own_module(tmp_path):
    probe = (
        "import sys\nfrom flows.cli import main\n"
        f"assert main(['artifacts', 'list', '--root', {str(tmp_path)!r}]) == 0\n"
        "print(sorted(m for m in ('torch', 'flows.config', 'learners') if m in sys.modules))"
    )
    result = _python("-c", probe)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"
