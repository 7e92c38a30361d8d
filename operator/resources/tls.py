"""spec.runtime.tls: the Secret's volume in the runtime pods, and how the others reach a pod that serves TLS.

The Secret (type kubernetes.io/tls, cert-manager's key names) is mounted read-only as a folder, so that the
kubelet swaps the files in when cert-manager renews the certificate (it never updates a `subPath` mount);
the runtime reloads them (runtime/tls.py). The Secret's name is in
the pod template: naming another Secret rolls the pods, a renewed certificate in the same Secret does not.
What talks to the pods follows the pods themselves, not the spec: during a rollout that turns TLS on or off,
old and new pods differ, and each is called the way its probes are.
"""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import InferenceServiceSpec
from pagoda.runtime.contract import TLS_CA_KEY, TLS_DIR

from .meta import CONTAINER_NAME

TLS_VOLUME = "tls"
# Readable by the runtime's group only (the pod's fsGroup): the private key is in it.
TLS_FILE_MODE = 0o440


def tls_volume(spec: InferenceServiceSpec) -> dict[str, Any]:
    assert spec.runtime.tls is not None
    secret = {"secretName": spec.runtime.tls.secret_name, "defaultMode": TLS_FILE_MODE}
    return {"name": TLS_VOLUME, "secret": secret}


def tls_mount() -> dict[str, Any]:
    return {"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True}


def scheme(spec: InferenceServiceSpec) -> str:
    """The runtime's URL scheme: https with spec.runtime.tls."""
    return "https" if spec.runtime.tls is not None else "http"


def service_dns_name(name: str, namespace: str) -> str:
    """The name clients verify the pods' certificate against (the certificate must carry it)."""
    return f"{name}.{namespace}.svc"


def scrape_tls(name: str, namespace: str, spec: InferenceServiceSpec) -> dict[str, Any]:
    """A ServiceMonitor endpoint's scheme and tlsConfig (Prometheus Operator's SafeTLSConfig): the Secret's
    ca.crt and the Service's DNS name, or no verification with insecureSkipVerify."""
    tls = spec.runtime.tls
    if tls is None:
        # Said, not left to Prometheus' default: the endpoints are an atomic list, so a ServiceMonitor that
        # scraped over TLS must differ in a field the operator compares for turning TLS off to rewrite it
        # (reconcile/compare.py projects the live object onto the desired keys; tlsConfig alone would stay).
        return {"scheme": "http"}
    if tls.insecure_skip_verify:
        return {"scheme": "https", "tlsConfig": {"insecureSkipVerify": True}}
    ca = {"secret": {"name": tls.secret_name, "key": TLS_CA_KEY}}
    return {"scheme": "https", "tlsConfig": {"ca": ca, "serverName": service_dns_name(name, namespace)}}


def pod_url(pod: dict[str, Any], port: int, path: str) -> str:
    """`<scheme>://<pod IP>:<port><path>` for a runtime pod: https when its runtime container's probes are
    (the pod was made with spec.runtime.tls), else http. The startup probe is read first: it is the one the
    operator's pod cache keeps (reconcile/cache.py)."""
    ip = str((pod.get("status") or {}).get("podIP") or "")
    host = f"[{ip}]" if ":" in ip else ip
    return f"{pod_scheme(pod)}://{host}:{port}{path}"


def pod_scheme(pod: dict[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            probe = container.get("startupProbe") or container.get("readinessProbe") or {}
            return "https" if (probe.get("httpGet") or {}).get("scheme") == "HTTPS" else "http"
    return "http"
