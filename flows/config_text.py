"""The text side of run configs: ``--set KEY=VALUE`` overrides and one line per problem.

``flows.config`` loads and validates; this module turns what a user typed into the config
document and what pydantic refused into ``ConfigError`` lines that name the field, what is
wrong and the value found.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config file, an override or a value was refused; one line per problem."""


def apply_override(document: dict[str, Any], override: str) -> None:
    """Set ``a.b.c=value`` in ``document`` (nested dicts created as needed); the value is
    parsed as YAML."""
    key, sep, raw = override.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError(
            f"--set {override!r}: expected KEY=VALUE with a dotted key, "
            "e.g. --set learners.inner.lr=0.05"
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as error:
        raise ConfigError(
            f"--set {override!r}: value is not valid YAML: {one_line(error)}"
        ) from None
    node = document
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ConfigError(
                f"--set {override!r}: {where} is {child!r}, not a section; cannot set "
                f"{'.'.join(parts[depth + 1 :])} inside it"
            )
        node = child
    node[parts[-1]] = value


def format_errors(error: ValidationError, model: type[BaseModel]) -> list[str]:
    """One ``field.path: what is wrong (got VALUE)`` line per pydantic error of validating
    ``model``."""
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "<config>"
        kind, message = item["type"], item["msg"]
        if kind == "extra_forbidden":
            lines.append(f"{where}: unknown field{_allowed(model, item['loc'])}")
            continue
        if kind == "missing":
            lines.append(f"{where}: required field is missing")
            continue
        if kind in ("value_error", "assertion_error"):
            # Validators (ours and learners.config's) already name the value they refused.
            message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
            lines.append(f"{where}: {message}")
            continue
        found = item.get("input")
        shown = "" if isinstance(found, dict | list) else f" (got {found!r})"
        lines.append(f"{where}: {message}{shown}")
    return lines


def _allowed(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """``; expected one of: a, b`` for the section of ``root`` that holds the unknown key."""
    model: Any = root
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        field = getattr(model, "model_fields", {}).get(part)
        if field is None:
            return ""
        model = field.annotation
        if get_origin(model) is dict and parts:
            parts.pop(0)  # a key of the mapping, e.g. the module id in learners.modules
            model = get_args(model)[1]
    fields = getattr(model, "model_fields", None)
    return f"; expected one of: {', '.join(sorted(fields))}" if fields else ""


def one_line(error: Exception) -> str:
    """``error``'s message on one line."""
    return " ".join(str(error).split())
