"""The field reference of docs/api.md, generated from the same schema as the CRD (`make crds`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

BEGIN = "<!-- BEGIN GENERATED FIELD REFERENCE (make crds) -->"
END = "<!-- END GENERATED FIELD REFERENCE -->"


def _type(node: dict[str, Any]) -> str:
    if node.get("x-kubernetes-int-or-string"):
        return "int or string"
    kind = str(node.get("type", ""))
    if kind == "array":
        return f"[]{_type(node.get('items', {}))}"
    if kind == "object" and isinstance(node.get("additionalProperties"), dict):
        return f"map[string]{_type(node['additionalProperties'])}"
    if "enum" in node:
        return " \\| ".join(f"`{value}`" for value in node["enum"])
    return kind


def _rows(node: dict[str, Any], path: str, required: bool) -> Iterator[str]:
    description = str(node.get("description", "")).replace("|", "\\|").replace("\n", " ")
    yield f"| `{path}` | {_type(node)} | {'yes' if required else ''} | {description} |"
    target = node.get("items", node) if node.get("type") == "array" else node
    suffix = "[]" if node.get("type") == "array" else ""
    for name, sub in target.get("properties", {}).items():
        yield from _rows(sub, f"{path}{suffix}.{name}", name in target.get("required", []))


def markers(kind: str | None = None) -> tuple[str, str]:
    """The generated block's markers: the InferenceService's (kind None), or another kind's."""
    if kind is None:
        return BEGIN, END
    return (
        f"<!-- BEGIN GENERATED {kind} REFERENCE (make crds) -->",
        f"<!-- END GENERATED {kind} REFERENCE -->",
    )


def reference(root: dict[str, Any], kind: str | None = None) -> str:
    """Markdown tables for spec and status."""
    begin, end = markers(kind)
    lines = [begin, ""]
    for part in ("spec", "status"):
        title = f"### {kind} {part}" if kind else f"### {part}"
        lines += [title, "", "| Field | Type | Required | Description |", "|---|---|---|---|"]
        lines += list(_rows(root["properties"][part], part, part == "spec"))
        lines.append("")
    lines.append(end)
    return "\n".join(lines)


def splice(document: str, generated: str, kind: str | None = None) -> str:
    """Replace the generated block of docs/api.md (appending it when the markers are missing)."""
    begin, end = markers(kind)
    if begin in document and end in document:
        head, rest = document.split(begin, 1)
        return head + generated + rest.split(end, 1)[1]
    return document.rstrip("\n") + "\n\n" + generated + "\n"
