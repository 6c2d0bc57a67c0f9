"""The algorithm registry is the one place an algorithm's name is matched: outside
learners/algorithms/, at most one product file holds a name as a string literal."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import pytest
from pydantic import ValidationError

from learners import MetaConfig
from learners.algorithms.catalog import algorithm_for, registered_algorithms, registered_names
from learners.algorithms.registry import register_algorithm
from tests.helpers.paths import REPO

ROOM = Path("learners") / "algorithms"


def _files_naming(root: Path, names: set[str]) -> dict[str, list[str]]:
    """Product file (outside the algorithms' room) -> the algorithm names it holds as string
    literals, by tokenizing every module (comments and docstring prose do not count, a
    docstring that is exactly a name would)."""
    found: dict[str, list[str]] = {}
    for package in ("pipeline", "learners", "flows"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative.is_relative_to(ROOM):
                continue
            tokens = tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
            hits = [
                t.string.strip("'\"")
                for t in tokens
                if t.type == tokenize.STRING and t.string.strip("'\"") in names
            ]
            if hits:
                found[relative.as_posix()] = hits
    return found


def test_outside_the_room_at_most_one_product_file_names_an_algorithm() -> None:
    names = set(registered_names())
    assert names == {"maml", "fomaml", "metasgd", "macaw", "context"}
    found = _files_naming(REPO, names)
    assert len(found) <= 1, f"files naming an algorithm outside {ROOM}: {found}"


def test_the_check_finds_a_name_in_a_string_but_not_in_a_comment(tmp_path: Path) -> None:
    (tmp_path / "flows").mkdir()
    (tmp_path / "flows" / "named.py").write_text('KIND = "macaw"  # context\n')
    (tmp_path / "flows" / "prose.py").write_text('"""Adapts like maml."""\n# "context"\n')
    assert _files_naming(tmp_path, {"macaw", "context", "maml"}) == {"flows/named.py": ["macaw"]}


def test_every_family_answers_the_whole_protocol() -> None:
    for algorithm in registered_algorithms():
        for name in algorithm.names:
            assert algorithm_for(name) is algorithm
        assert algorithm.section is None or algorithm.section in MetaConfig.model_fields


def test_an_unknown_algorithm_and_a_name_taken_twice_are_refused() -> None:
    with pytest.raises(ValidationError) as caught:
        MetaConfig(algorithm="reptile")
    assert "Input should be 'context', 'fomaml', 'macaw', 'maml' or 'metasgd'" in str(caught.value)
    with pytest.raises(ValueError) as unknown:
        algorithm_for("reptile")
    assert str(unknown.value) == (
        "unknown algorithm 'reptile': expected one of "
        "['context', 'fomaml', 'macaw', 'maml', 'metasgd']"
    )
    with pytest.raises(ValueError) as twice:
        register_algorithm(algorithm_for("macaw"))
    assert str(twice.value) == "algorithm name 'macaw' is registered twice"
