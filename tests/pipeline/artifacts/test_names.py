"""Names and reference strings: refused with a clear message, nothing written anywhere."""

from __future__ import annotations

import re

import pytest
import torch

from pipeline.artifacts import ArtifactNameError, ArtifactStore
from pipeline.artifacts.records.names import Spec, parse_spec, validate_name

ALLOWED = (
    "letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. 'sinusoid-maml')"
)
BAD_NAMES = [
    ("", f"artifact name is empty; expected 1-128 {ALLOWED}"),
    (
        "x" * 129,
        "artifact name 'xxxxxxxxxxxxxxxxxxxxxxxx'... is 129 characters long; the limit is 128",
    ),
    (
        "..",
        "artifact name '..' contains '..'; names cannot refer to a parent directory",
    ),
    (
        "a..b",
        "artifact name 'a..b' contains '..'; names cannot refer to a parent directory",
    ),
    (
        "../escape",
        f"artifact name '../escape' contains the path separator '/'; "
        f"expected a single name made of {ALLOWED}",
    ),
    (
        "a/b",
        f"artifact name 'a/b' contains the path separator '/'; "
        f"expected a single name made of {ALLOWED}",
    ),
    (
        "a\\b",
        f"artifact name 'a\\\\b' contains the path separator '\\\\'; "
        f"expected a single name made of {ALLOWED}",
    ),
    (
        "/etc/passwd",
        "artifact name '/etc/passwd' is an absolute path; "
        f"expected a single name made of {ALLOWED}",
    ),
    (
        "C:evil",
        f"artifact name 'C:evil' is an absolute path; expected a single name made of {ALLOWED}",
    ),
    (
        "bad\nname",
        f"artifact name 'bad\\nname' contains the control character '\\n' at position 3; "
        f"allowed are {ALLOWED}",
    ),
    (
        "nul\x00",
        f"artifact name 'nul\\x00' contains the control character '\\x00' at position 3; "
        f"allowed are {ALLOWED}",
    ),
    (
        "del\x7f",
        f"artifact name 'del\\x7f' contains the control character '\\x7f' at position 3; "
        f"allowed are {ALLOWED}",
    ),
    (".hidden", f"artifact name '.hidden' contains '.'; allowed are {ALLOWED}"),
    ("has space", f"artifact name 'has space' contains ' '; allowed are {ALLOWED}"),
    ("a+b", f"artifact name 'a+b' contains '+'; allowed are {ALLOWED}"),
    ("café", f"artifact name 'café' contains 'é'; allowed are {ALLOWED}"),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("name", "message"), BAD_NAMES, ids=[repr(n)[:20] for n, _ in BAD_NAMES])
def test_bad_names_are_refused_with_a_message_and_nothing_is_written(tmp_path, name, message):
    store = ArtifactStore(tmp_path / "store")
    params = {"default_policy": {"w": torch.ones(2)}}
    with pytest.raises(ArtifactNameError) as raised:
        store.publish(name, params, metrics={}, config={}, lineage={})
    assert str(raised.value) == message
    with pytest.raises(ArtifactNameError):
        store.get(name)
    with pytest.raises(ArtifactNameError):
        store.list_versions(name)
    assert list(tmp_path.iterdir()) == []
    assert not (tmp_path.parent / "escape").exists()


@pytest.mark.timeout(30)
def test_bad_alias_and_file_names_are_refused_before_anything_is_written(tmp_path):
    store = ArtifactStore(tmp_path / "store")
    params = {"default_policy": {"w": torch.ones(2)}}
    store.publish("model", params, metrics={}, config={}, lineage={})
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(
        ArtifactNameError, match="^" + re.escape("alias name '../prod' contains the path separator")
    ):
        store.set_alias("model", "../prod", 1, expected=None)
    with pytest.raises(
        ArtifactNameError, match="^" + re.escape("file name 'a/b.txt' contains the path separator")
    ):
        store.publish("model", params, metrics={}, config={}, lineage={}, files=[("a/b.txt", b"")])
    with pytest.raises(
        ArtifactNameError, match="^" + re.escape("file name 'metrics.json' is reserved")
    ):
        store.publish(
            "model", params, metrics={}, config={}, lineage={}, files=[("metrics.json", b"{}")]
        )
    with pytest.raises(
        ArtifactNameError, match="^" + re.escape("artifact name 'maml@prod' contains '@'")
    ):
        store.publish("maml@prod", params, metrics={}, config={}, lineage={})
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("maml", Spec("maml", alias="latest")),
        ("maml:17", Spec("maml", version=17)),
        ("maml@prod", Spec("maml", alias="prod")),
        ("sinusoid.v2_b-1@latest", Spec("sinusoid.v2_b-1", alias="latest")),
    ],
)
def test_reference_strings_parse(text, spec):
    assert parse_spec(text) == spec


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("maml:0", "version in 'maml:0' must be a positive integer like 17, got 0"),
        ("maml:x", "version in 'maml:x' must be a positive integer like 17, got 'x'"),
        ("maml:", "version in 'maml:' must be a positive integer like 17, got ''"),
        ("maml@", f"alias name is empty; expected 1-128 {ALLOWED}"),
        ("@prod", f"artifact name is empty; expected 1-128 {ALLOWED}"),
        (
            "maml@a/b",
            "alias name 'a/b' contains the path separator '/'; "
            f"expected a single name made of {ALLOWED}",
        ),
        (17, "artifact reference must be a string like 'name:17' or 'name@latest', got int 17"),
    ],
)
def test_bad_reference_strings_are_refused(text, message):
    with pytest.raises(ArtifactNameError) as raised:
        parse_spec(text)
    assert str(raised.value) == message


@pytest.mark.timeout(10)
def test_the_longest_allowed_name_is_accepted():
    assert validate_name("a" * 128) == "a" * 128
