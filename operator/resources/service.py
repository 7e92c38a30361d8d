"""The Service in front of the runtime pods."""

from __future__ import annotations

from typing import Any

from pagoda.contract import PORT_NAME
from pagoda.operator.api import InferenceServiceSpec

from .meta import metadata, selector


def service(name: str, namespace: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    port: dict[str, Any] = {
        "name": PORT_NAME,
        "port": spec.service.port,
        "targetPort": PORT_NAME,
        "protocol": "TCP",
    }
    if spec.runtime.tls is not None:  # for meshes and gateways that read it: the pods speak TLS
        port["appProtocol"] = "https"
    body = {"type": spec.service.type, "selector": selector(name), "ports": [port]}
    return {"apiVersion": "v1", "kind": "Service", "metadata": metadata(name, namespace), "spec": body}
