"""The Prometheus Operator ServiceMonitor that scrapes the runtime's /metrics through the Service (over TLS
with spec.runtime.tls: resources/tls.py)."""

from __future__ import annotations

from typing import Any

from pagoda.contract import PORT_NAME
from pagoda.operator.api import InferenceServiceSpec

from .meta import labels, metadata, selector
from .tls import scrape_tls


def service_monitor(name: str, namespace: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    monitor = spec.monitoring.service_monitor
    meta = metadata(name, namespace)
    meta["labels"] = {**monitor.labels, **labels(name)}  # the owner labels always win
    endpoint = {"port": PORT_NAME, "path": "/metrics", "interval": monitor.interval}
    body = {
        "selector": {"matchLabels": selector(name)},
        "endpoints": [{**endpoint, **scrape_tls(name, namespace, spec)}],
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": body,
    }
