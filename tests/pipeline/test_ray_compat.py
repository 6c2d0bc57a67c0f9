"""Ray's private API is called from ``pipeline/ray_compat.py`` only, under the Ray series it
was checked against."""

from __future__ import annotations

import re

import pytest

from pipeline.ray_compat import check_ray_version
from tests.helpers.paths import REPO

COMPAT = REPO / "pipeline" / "ray_compat.py"

PRIVATE_RAY = re.compile(
    r"\bray\._"
    r"|\bray\.data\._"
    r"|\bfrom ray\._"
    r"|\bfrom ray\.data\._"
    r"|_deep_copy"
    r"|iter_internal_ref_bundles"
    r"|_generator_backpressure"
    r"|_get_data_columns"
    r"|_projection_map"
    r"|\bblock_refs\b"
)
"""Ray's private modules, and the private names offmeta is known to need."""


def private_ray_uses(text: str) -> list[tuple[int, str]]:
    """``(line number, line)`` of each line of ``text`` that names a private Ray attribute."""
    return [
        (number, line.strip())
        for number, line in enumerate(text.splitlines(), start=1)
        if PRIVATE_RAY.search(line)
    ]


@pytest.mark.parametrize("version", ["2.60.0", "2.60.3", "2.60.0rc1"])
def test_the_checked_ray_series_is_accepted(version):
    check_ray_version(version)


@pytest.mark.parametrize("version", ["2.61.0", "2.59.2", "3.60.0", "2.6.0", "nightly"])
def test_any_other_ray_version_is_refused_in_one_line(version):
    with pytest.raises(ImportError) as refused:
        check_ray_version(version)
    assert str(refused.value) == (
        f"offmeta supports ray 2.60.x (found {version}): its calls into Ray's private API "
        "(pipeline/ray_compat.py) were checked against that series only; install ray==2.60.*"
    )


def test_the_scan_sees_every_kind_of_private_ray_use():
    text = "\n".join(
        [
            "import ray._private.worker",
            "from ray.data._internal.execution import RefBundle",
            "dataset.copy(_deep_copy=True)",
            "bundles = dataset.iter_internal_ref_bundles()",
            "fn.options(_generator_backpressure_num_objects=4)",
            "columns = self._get_data_columns()",
            "self._projection_map = None",
            "refs = bundle.block_refs",
            "logging.getLogger('ray._private.worker')",
            "import ray.data  # public",
            "array._data = ray.get(ref)",
        ]
    )
    assert [number for number, _ in private_ray_uses(text)] == list(range(1, 10))


def test_no_module_but_ray_compat_names_a_private_ray_attribute():
    found = [
        f"{path.relative_to(REPO)}:{number}: {line}"
        for package in ("pipeline", "flows")
        for path in sorted((REPO / package).rglob("*.py"))
        if path != COMPAT
        for number, line in private_ray_uses(path.read_text())
    ]
    assert not found, "private Ray API outside pipeline/ray_compat.py:\n" + "\n".join(found)
