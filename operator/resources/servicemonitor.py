"""The Prometheus Operator ServiceMonitor that scrapes the runtime's /metrics through the Service."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import ServiceMonitorSpec
from pagoda.runtime.contract import PORT_NAME

from .meta import labels, metadata, selector


def service_monitor(name: str, namespace: str, monitor: ServiceMonitorSpec) -> dict[str, Any]:
    meta = metadata(name, namespace)
    meta["labels"] = {**monitor.labels, **labels(name)}  # the owner labels always win
    body = {
        "selector": {"matchLabels": selector(name)},
        "endpoints": [{"port": PORT_NAME, "path": "/metrics", "interval": monitor.interval}],
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": meta,
        "spec": body,
    }
