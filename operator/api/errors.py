"""Readable, field-named messages for a spec that failed validation (for Degraded conditions and logs)."""

from __future__ import annotations

from pydantic import ValidationError

_VALUE_ERROR_PREFIX = "Value error, "


def field_path(loc: tuple[int | str, ...]) -> str:
    """`spec.engine.extraArgs[2]` for a pydantic error location."""
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def error_messages(exc: ValidationError) -> list[str]:
    """One line per error, each naming the field (rule messages already do, so they stay as written)."""
    lines = []
    for error in exc.errors(include_url=False):
        message = str(error["msg"]).removeprefix(_VALUE_ERROR_PREFIX)
        path = field_path(tuple(error["loc"]))
        names_its_field = message.startswith(("spec.", "metadata."))
        lines.append(message if names_its_field else f"{path}: {message}")
    return lines


def describe(exc: ValidationError) -> str:
    """All errors on one line, e.g. for a condition message."""
    return "; ".join(error_messages(exc))
