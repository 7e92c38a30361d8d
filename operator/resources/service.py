"""The Service in front of the runtime pods."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import InferenceServiceSpec
from pagoda.runtime.contract import PORT_NAME

from .meta import metadata, selector


def service(name: str, namespace: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    port = {"name": PORT_NAME, "port": spec.service.port, "targetPort": PORT_NAME, "protocol": "TCP"}
    body = {"type": spec.service.type, "selector": selector(name), "ports": [port]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(name, namespace), "spec": body}
