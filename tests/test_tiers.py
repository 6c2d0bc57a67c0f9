"""The two tiers (``make test``: quick; ``make test-system``: ``pytest.mark.system``): every
test file is in exactly one, by the rule of ``tests/helpers/tiers.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.paths import REPO
from tests.helpers.tiers import file_tier, suite_files, tier_problems

TESTS = REPO / "tests"


def test_every_test_file_keeps_the_tier_rule() -> None:
    problems = [
        problem
        for path in suite_files(TESTS)
        for problem in tier_problems(str(path.relative_to(REPO)), path.read_text())
    ]
    assert problems == []


def test_the_tests_of_this_run_carry_the_marker_of_their_file(request: pytest.FixtureRequest):
    # What pytest itself applies (a marker given some way the source rule does not read would
    # put a file in a tier the rule does not see).
    tiers = {path: file_tier(path.read_text()) for path in suite_files(TESTS)}
    wrong = [
        item.nodeid
        for item in request.session.items
        if (item.get_closest_marker("system") is not None)
        != (tiers.get(Path(item.path), "quick") == "system")
    ]
    assert wrong == []


_MIXED = """
import pytest

@pytest.mark.system
def test_on_a_cluster(): ...

def test_quick(): ...

class TestMore:
    def test_also_quick(self): ...
"""


def test_a_file_with_tests_in_both_tiers_is_one_line() -> None:
    assert tier_problems("tests/x/test_mixed.py", _MIXED) == [
        "tests/x/test_mixed.py: TestMore.test_also_quick, test_quick quick, the other tests "
        "system; a file is in one tier: mark the module (pytestmark = pytest.mark.system) or "
        "move the system tests to a file of their own"
    ]


_KILLS = """
import os, signal, subprocess
from tests.helpers.ray_cluster import ray_cluster

# a comment that says Popen or moto_server is no sign
def test_kills():
    child = subprocess.Popen(["sleep", "9"])
    os.kill(child.pid, signal.SIGKILL)
"""


def test_a_quick_file_that_needs_a_system_is_one_line_naming_each_sign() -> None:
    assert tier_problems("tests/test_k.py", _KILLS) == [
        "tests/test_k.py: starts a Ray cluster (tests.helpers.ray_cluster); starts a process "
        "that outlives a call (a server, a process to kill) (Popen); kills a process "
        "(SIGKILL); kills a process (kill); but it is in the quick tier: mark the module "
        "(pytestmark = pytest.mark.system)"
    ]


@pytest.mark.parametrize(
    "marking",
    [
        "pytestmark = pytest.mark.system\n",
        'pytestmark = [pytest.mark.usefixtures("s3_endpoint"), pytest.mark.system]\n',
    ],
)
def test_a_marked_module_keeps_the_rule_and_is_system(marking: str) -> None:
    source = f"import pytest\n{marking}{_KILLS.replace('import pytest', '')}"
    assert tier_problems("tests/test_k.py", source) == []
    assert file_tier(source) == "system"


def test_every_test_marked_is_the_system_tier_and_a_plain_file_is_quick() -> None:
    marked = "@pytest.mark.system\ndef test_{}(): ...\n"
    every = "import pytest\n" + marked.format("a") + marked.format("b")
    assert tier_problems("tests/test_e.py", every) == []
    assert file_tier(every) == "system"
    assert file_tier("def test_a(): ...\n") == "quick"
    assert tier_problems("tests/test_p.py", "def test_a(): ...\n") == []
