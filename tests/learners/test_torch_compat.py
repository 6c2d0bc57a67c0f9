"""Private torch names stay in learners/torch_compat.py, and an untested torch is refused at
import with the supported range."""

from __future__ import annotations

import re
import tomllib

import pytest

from learners.torch_compat import SUPPORTED_TORCH, check_torch_version
from tests.helpers.paths import REPO

_PRIVATE = re.compile(r"\btorch\._")


def test_no_learners_module_but_torch_compat_names_a_private_torch_api():
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for path in sorted((REPO / "learners").rglob("*.py"))
        if path.name != "torch_compat.py"
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if _PRIVATE.search(line)
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "version", ["2.11.0", "2.11.0+cu128", "2.12.1", "2.13.0+cpu", "2.13.0a0+git1"]
)
def test_the_tested_torch_versions_are_accepted(version):
    check_torch_version(version)


@pytest.mark.parametrize("version", ["2.10.1", "2.14.0", "2.14.0.dev20260101", "3.0.0", "nightly"])
def test_an_untested_torch_is_refused_in_one_line_naming_the_range(version):
    with pytest.raises(ImportError) as error:
        check_torch_version(version)
    assert str(error.value) == (
        "learners needs torch>=2.11,<2.14 (its private torch calls in learners/torch_compat.py "
        f"were checked against 2.11 and 2.13), found torch {version!r}: install a torch in "
        "that range"
    )


def test_the_package_requires_the_range_torch_compat_was_checked_against():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert SUPPORTED_TORCH in project["dependencies"]
