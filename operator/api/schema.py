"""Pydantic JSON Schema -> Kubernetes structural OpenAPI v3 schema.

Structural means: every node has a type, no $ref, no anyOf except the int-or-string form, no
`additionalProperties: false`. Optional fields lose their `null` branch (the API server prunes nulls);
defaults stay out of the CRD (they belong to the operator's version) and are written into descriptions.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

_KEEP = {
    "type",
    "description",
    "enum",
    "format",
    "pattern",
    "minimum",
    "maximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "required",
}


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural schema of a pydantic model (by alias, validation mode)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}))


_ORDER = ["description", "type", "x-kubernetes-int-or-string", "anyOf"]


def _convert(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    node = _resolve(node, defs)
    if "anyOf" in node:
        return _any_of(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _KEEP or key.startswith("x-kubernetes-"):
            out[key] = value
        elif key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum"):
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        elif key == "properties":
            out[key] = {name: _convert(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out[key] = _convert(value, defs)
        elif key == "additionalProperties" and isinstance(value, dict) and "properties" not in node:
            out[key] = _convert(value, defs)
    _describe(out, node)
    if "type" not in out:
        if "properties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            raise ValueError(f"schema node without a type: {node}")
        out["type"] = "object"
    return _ordered(out)


def _describe(out: dict[str, Any], node: dict[str, Any]) -> None:
    """Keep the description, and state a scalar default in it (defaults stay out of the CRD)."""
    description = str(node.get("description", "")).strip()
    default = node.get("default")
    if default is not None and default != [] and default != {}:
        description = f"{description} Default: {json.dumps(default)}.".strip()
    if description:
        out["description"] = description


def _ordered(out: dict[str, Any]) -> dict[str, Any]:
    head = [key for key in _ORDER if key in out]
    tail = [key for key in ("properties", "items", "additionalProperties", "required") if key in out]
    rest = sorted(key for key in out if key not in head and key not in tail)
    return {key: out[key] for key in head + rest + tail}


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline a $ref (or a single-entry allOf), the referring node's keys winning."""
    ref = node.get("$ref")
    if ref is None and len(node.get("allOf", [])) == 1:
        ref = node["allOf"][0].get("$ref")
    if ref is None:
        return node
    target = _resolve(defs[ref.rsplit("/", 1)[-1]], defs)
    merged = {**target, **{k: v for k, v in node.items() if k not in ("$ref", "allOf")}}
    extra = target.get("x-kubernetes-validations", []) + node.get("x-kubernetes-validations", [])
    if extra:
        merged["x-kubernetes-validations"] = extra
    return merged


def _any_of(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    branches = [_resolve(b, defs) for b in node["anyOf"] if b.get("type") != "null"]
    outer = {k: v for k, v in node.items() if k != "anyOf"}
    if node.get("x-kubernetes-int-or-string") or {b.get("type") for b in branches} == {"integer", "string"}:
        result: dict[str, Any] = {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
        }
        pattern = node.get("pattern") or next((b["pattern"] for b in branches if "pattern" in b), None)
        if pattern:
            result["pattern"] = pattern  # applies to the string form
        for key in ("maxLength", "minimum"):  # maxLength applies to the string form, minimum to the integer
            bound = node.get(key, next((b[key] for b in branches if key in b), None))
            if bound is not None:
                result[key] = bound
        _describe(result, outer)
        return _ordered(result)
    if len(branches) != 1:
        raise ValueError(f"anyOf with several non-null branches is not structural: {node}")
    merged = {**branches[0], **outer}
    if branches[0].get("x-kubernetes-validations"):
        merged["x-kubernetes-validations"] = branches[0]["x-kubernetes-validations"]
    return _convert(merged, defs)
