"""Validation of the names that become path components, and of reference strings.

Artifact names, alias names and attached file names all end up as one component of a
path under the store root, so each is checked here before any path is built: a name
that passes cannot point outside its directory.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from pipeline.artifacts.errors import ArtifactNameError

MAX_NAME_LENGTH = 128
_ALLOWED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_ALLOWED_TEXT = (
    "letters, digits, '.', '_' and '-', starting with a letter or digit (e.g. 'sinusoid-maml')"
)


def validate_name(value: object, kind: str = "artifact name") -> str:
    """Return ``value`` if it is a safe single path component, else raise ArtifactNameError.

    ``kind`` ("artifact name", "alias name", "file name") starts every message, so the
    caller's error says which argument was wrong.
    """
    if not isinstance(value, str):
        raise ArtifactNameError(f"{kind} must be a string, got {type(value).__name__} {value!r}")
    if not value:
        raise ArtifactNameError(f"{kind} is empty; expected 1-{MAX_NAME_LENGTH} {_ALLOWED_TEXT}")
    if len(value) > MAX_NAME_LENGTH:
        raise ArtifactNameError(
            f"{kind} {value[:24]!r}... is {len(value)} characters long; "
            f"the limit is {MAX_NAME_LENGTH}"
        )
    for position, char in enumerate(value):
        if unicodedata.category(char) == "Cc":
            raise ArtifactNameError(
                f"{kind} {value!r} contains the control character {char!r} at position "
                f"{position}; allowed are {_ALLOWED_TEXT}"
            )
    if value.startswith(("/", "\\")) or re.match(r"[A-Za-z]:", value):
        raise ArtifactNameError(
            f"{kind} {value!r} is an absolute path; expected a single name made of {_ALLOWED_TEXT}"
        )
    for separator in ("/", "\\"):
        if separator in value:
            raise ArtifactNameError(
                f"{kind} {value!r} contains the path separator {separator!r}; "
                f"expected a single name made of {_ALLOWED_TEXT}"
            )
    if ".." in value:
        raise ArtifactNameError(
            f"{kind} {value!r} contains '..'; names cannot refer to a parent directory"
        )
    if not _ALLOWED.fullmatch(value):
        bad = next(
            (c for c in value if not (c.isascii() and (c.isalnum() or c in "._-"))), value[0]
        )
        raise ArtifactNameError(f"{kind} {value!r} contains {bad!r}; allowed are {_ALLOWED_TEXT}")
    return value


@dataclass(frozen=True)
class Spec:
    """A parsed reference string: exactly one of ``version`` and ``alias`` is set."""

    name: str
    version: int | None = None
    alias: str | None = None


def parse_spec(text: object) -> Spec:
    """Parse ``"name:17"``, ``"name@alias"`` or ``"name"`` (meaning ``"name@latest"``)."""
    if not isinstance(text, str):
        raise ArtifactNameError(
            f"artifact reference must be a string like 'name:17' or 'name@latest', "
            f"got {type(text).__name__} {text!r}"
        )
    if "@" in text:
        name, alias = text.split("@", 1)
        return Spec(validate_name(name), alias=validate_name(alias, "alias name"))
    if ":" in text:
        name, number = text.split(":", 1)
        return Spec(validate_name(name), version=parse_version(number, source=text))
    return Spec(validate_name(text), alias="latest")


def parse_version(value: object, *, source: str | None = None) -> int:
    """Return a positive version number from an int or a decimal string."""
    where = f" in {source!r}" if source is not None else ""
    if isinstance(value, bool):
        raise ArtifactNameError(f"version{where} must be a positive integer, got {value!r}")
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or value < 1:
        raise ArtifactNameError(f"version{where} must be a positive integer like 17, got {value!r}")
    return value
