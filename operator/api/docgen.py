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


def reference(root: dict[str, Any]) -> str:
    """Markdown tables for spec and status."""
    lines = [BEGIN, ""]
    for part in ("spec", "status"):
        lines += [f"### {part}", "", "| Field | Type | Required | Description |", "|---|---|---|---|"]
        lines += list(_rows(root["properties"][part], part, part == "spec"))
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def splice(document: str, generated: str) -> str:
    """Replace the generated block of docs/api.md (appending it when the markers are missing)."""
    if BEGIN in document and END in document:
        head, rest = document.split(BEGIN, 1)
        return head + generated + rest.split(END, 1)[1]
    return document.rstrip("\n") + "\n\n" + generated + "\n"
