"""Pure comparison of a desired manifest against the live object: decides whether an apply is needed.

Server-side apply only ever sets the fields we send, so the live object is projected onto the desired
manifest's keys before comparing: fields the API server defaulted (imagePullPolicy, probe timeouts, ...)
and fields other managers own (an HPA's replicas, an added annotation) never count as drift. Lists of
objects are matched by their merge key (name, containerPort, ...) like server-side apply does, and resource
quantities compare by value ("1000m" equals "1"), because the API server rewrites them in canonical form.
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from pagoda.operator.resources.meta import FIELD_MANAGER

# Keys by which server-side apply merges lists of objects in the kinds Pagoda builds.
MERGE_KEYS = ("name", "containerPort", "port", "mountPath", "devicePath", "uid")
# Parents whose scalar children are resource quantities.
QUANTITY_PARENTS = frozenset({"limits", "requests", "capacity", "hard"})
QUANTITY_KEYS = frozenset({"sizeLimit", "storage"})


def matches(desired: Any, live: Any) -> bool:
    """True when every field of `desired` has the same value in `live` and we own no field beyond them."""
    return not differences(desired, live) and not stale_fields(desired, live)


def stale_fields(desired: dict[str, Any], live: dict[str, Any], manager: str = FIELD_MANAGER) -> list[str]:
    """Fields our last apply set (managedFields of `manager`) that `desired` no longer has.

    The projection in `differences` cannot see a field dropped from the desired manifest (e.g. `replicas`
    when autoscaling is turned on); applying again releases it, so such fields count as drift.
    """
    found: list[str] = []
    for entry in live.get("metadata", {}).get("managedFields") or []:
        if entry.get("manager") == manager and entry.get("operation") == "Apply":
            _stale(entry.get("fieldsV1") or {}, desired, "", found)
    return found


def _stale(owned: dict[str, Any], desired: Any, path: str, out: list[str]) -> None:
    for key, sub in owned.items():
        if key.startswith("f:"):
            name = key[2:]
            where = f"{path}.{name}" if path else name
            if not isinstance(desired, dict) or name not in desired or desired[name] is None:
                out.append(where)
            elif sub:
                _stale(sub, desired[name], where, out)
        elif key.startswith("k:"):
            ident = json.loads(key[2:])
            item = _find_item(desired, ident)
            if item is None:
                out.append(f"{path}[{key[2:]}]")
            elif sub:
                _stale(sub, item, f"{path}[{key[2:]}]", out)
        elif key.startswith("v:"):
            if not isinstance(desired, list) or json.loads(key[2:]) not in desired:
                out.append(f"{path}[{key[2:]}]")
        # "." (the item itself) and "i:" (positions in atomic lists) say nothing about removed fields.


def _find_item(desired: Any, ident: dict[str, Any]) -> Any:
    """The list item whose merge-key fields equal `ident` (fields the server defaulted are skipped)."""
    if not isinstance(desired, list):
        return None
    for item in desired:
        if isinstance(item, dict) and all(
            str(item[field]) == str(value) for field, value in ident.items() if field in item
        ):
            if any(field in item for field in ident):
                return item
    return None


def differences(desired: Any, live: Any, path: str = "") -> list[str]:
    """Paths (like `spec.template.spec.containers[name=runtime].image`) where `live` differs."""
    found: list[str] = []
    _diff(desired, live, path, parent="", out=found)
    return found


def _diff(desired: Any, live: Any, path: str, parent: str, out: list[str]) -> None:
    if isinstance(desired, dict):
        if not isinstance(live, dict):
            out.append(path or ".")
            return
        here = path.rsplit(".", 1)[-1]  # this map's own key: the parent of its scalar fields
        for key, value in desired.items():
            child = f"{path}.{key}" if path else key
            if key not in live:
                if value is not None and value != {} and value != []:
                    out.append(child)
                continue
            _diff(value, live[key], child, parent=here, out=out)
        return
    if isinstance(desired, list):
        _diff_list(desired, live, path, parent, out)
        return
    if desired is None:
        if live is not None:
            out.append(path)
        return
    if not _scalar_equal(desired, live, parent, path):
        out.append(path)


def _diff_list(desired: list[Any], live: Any, path: str, parent: str, out: list[str]) -> None:
    if not isinstance(live, list):
        out.append(path)
        return
    key = _merge_key(desired)
    if key is None:
        if len(desired) != len(live):
            out.append(path)
            return
        for index, (want, have) in enumerate(zip(desired, live, strict=True)):
            _diff(want, have, f"{path}[{index}]", parent=parent, out=out)
        return
    by_key = {item.get(key): item for item in live if isinstance(item, dict)}
    for want in desired:
        ident = want[key]
        have = by_key.get(ident)
        where = f"{path}[{key}={ident}]"
        if have is None:
            out.append(where)
        else:
            _diff(want, have, where, parent=parent, out=out)


def _merge_key(items: list[Any]) -> str | None:
    if not items or not all(isinstance(item, dict) for item in items):
        return None
    for key in MERGE_KEYS:
        values = [item.get(key) for item in items]
        if all(value is not None for value in values) and len(set(map(str, values))) == len(values):
            return key
    return None


def _scalar_equal(desired: Any, live: Any, parent: str, path: str) -> bool:
    if desired == live and type(desired) is type(live):
        return True
    if isinstance(desired, bool) or isinstance(live, bool):
        return False
    key = path.rsplit(".", 1)[-1]
    if parent in QUANTITY_PARENTS or key in QUANTITY_KEYS:
        return _quantity(desired) is not None and _quantity(desired) == _quantity(live)
    # JSON numbers: 1 and 1.0 are the same number.
    if isinstance(desired, int | float) and isinstance(live, int | float):
        return float(desired) == float(live)
    return False


def _quantity(value: Any) -> Decimal | None:
    if not isinstance(value, str | int | float):
        return None
    try:
        parsed: Decimal = parse_quantity(value)  # type: ignore[no-untyped-call]
    except (ValueError, InvalidOperation, TypeError):
        return None
    return parsed
