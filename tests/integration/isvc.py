"""Small helpers for InferenceServices in integration tests."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from e2e.lab.processes import wait_until

GROUP, VERSION, PLURAL = "pagoda.dev", "v1alpha1", "inferenceservices"

BASE_SPEC: dict[str, Any] = {
    "model": {"uri": "hf://pagoda-test/tiny-llama", "servedName": "tiny"},
    "engine": {"dtype": "bfloat16", "maxModelLen": 2048},
    "resources": {"gpu": {"count": 1}},
    "replicas": 2,
}


def merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Deep merge; a None value removes the key (like a JSON merge patch)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def manifest(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": merge(BASE_SPEC, spec),
    }


def create(api: client.CustomObjectsApi, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    body = manifest(name, namespace, **spec)
    created: dict[str, Any] = api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    return created


def get(api: client.CustomObjectsApi, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        found: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        return found
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def patch(api: client.CustomObjectsApi, name: str, namespace: str, spec: dict[str, Any]) -> dict[str, Any]:
    """JSON merge patch of the spec (None removes a field)."""
    api_client = api.api_client
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}/{name}"
    request = api_client.param_serialize(
        "PATCH",
        path,
        header_params={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
        body={"spec": spec},
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request)
    response.read()
    assert response.status == 200, response.data
    import json

    patched: dict[str, Any] = json.loads(response.data)
    return patched


def condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any]:
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == type_:
            return dict(cond)
    return {}


def is_true(obj: dict[str, Any] | None, type_: str) -> bool:
    return condition(obj, type_).get("status") == "True"


def ready_and_current(obj: dict[str, Any] | None) -> bool:
    """Ready, rollout finished, and the status is about the latest generation."""
    if not obj:
        return False
    status = obj.get("status") or {}
    return (
        status.get("observedGeneration") == obj["metadata"]["generation"]
        and is_true(obj, "Ready")
        and condition(obj, "Progressing").get("status") == "False"
        and condition(obj, "Degraded").get("status") == "False"
    )


def managed_fields_of(obj: Any, manager: str) -> dict[str, Any]:
    """The fieldsV1 set that `manager` owns through Apply (merged over its entries)."""
    owned: dict[str, Any] = {}
    entries = obj.metadata.managed_fields if hasattr(obj, "metadata") else obj["metadata"]["managedFields"]
    for entry in entries or []:
        name = entry.manager if hasattr(entry, "manager") else entry["manager"]
        fields = entry.fields_v1 if hasattr(entry, "fields_v1") else entry.get("fieldsV1")
        if name == manager and fields:
            owned.update(fields)
    return owned


def wait_ready(
    api: client.CustomObjectsApi, name: str, namespace: str, what: str = "Ready=True", timeout: float = 90
) -> dict[str, Any]:
    """Waits until the InferenceService is Ready with a current status (see ready_and_current); returns it."""
    found: dict[str, Any] = wait_until(
        lambda: (obj := get(api, name, namespace)) and ready_and_current(obj) and obj, what, timeout
    )
    return found


def create_ready(api: client.CustomObjectsApi, name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """Creates the InferenceService and waits until it is Ready (the start of most tests)."""
    create(api, name, namespace, **spec)
    return wait_ready(api, name, namespace)
