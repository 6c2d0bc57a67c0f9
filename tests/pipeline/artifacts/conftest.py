"""The ``storage`` fixture of the artifact-store tests: each test runs against both backends."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.artifact_backends import BACKENDS, Storage, make_storage


@pytest.fixture(params=BACKENDS)
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return make_storage(request, tmp_path)
