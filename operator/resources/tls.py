"""spec.runtime.tls: the Secret's volume in the runtime pods, and how the others reach a pod that serves TLS.

The Secret (type kubernetes.io/tls, cert-manager's key names) is mounted read-only as a folder, so that the
kubelet swaps the files in when cert-manager renews the certificate (it never updates a `subPath` mount);
the runtime reloads them (runtime/serving/tls.py). The Secret's name is in
the pod template: naming another Secret rolls the pods, a renewed certificate in the same Secret does not.
What talks to the pods follows the pods themselves, not the spec: during a rollout that turns TLS on or off,
old and new pods differ, and each is called the way its probes are. Whoever verifies the pods' certificate
checks it against the Secret's ca.crt and the Service's DNS name, which the certificate must carry (the pod
IP it connects to is not in it): Prometheus (scrape_tls) and the operator itself (pod_tls), which refuses to
call a pod it has no CA for rather than call it unverified, unless the spec says insecureSkipVerify.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

from pagoda.contract import TLS_CA_KEY, TLS_DIR
from pagoda.operator.api import InferenceServiceSpec

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
    operator's pod cache keeps (kube/cache.py)."""
    ip = str((pod.get("status") or {}).get("podIP") or "")
    host = f"[{ip}]" if ":" in ip else ip
    return f"{pod_scheme(pod)}://{host}:{port}{path}"


def pod_scheme(pod: dict[str, Any]) -> str:
    for container in (pod.get("spec") or {}).get("containers") or []:
        if container.get("name") == CONTAINER_NAME:
            probe = container.get("startupProbe") or container.get("readinessProbe") or {}
            return "https" if (probe.get("httpGet") or {}).get("scheme") == "HTTPS" else "http"
    return "http"


SPEC_TLS = "spec.runtime.tls"
FIX = f"add the issuing CA as {TLS_CA_KEY}, or set {SPEC_TLS}.insecureSkipVerify (docs/security.md#tls)"


@dataclass(frozen=True)
class PodTls:
    """How the operator calls one service's pods over TLS: through `context`, checking their certificate for
    `server_name` (sent as SNI too) unless `verified` is False (spec.runtime.tls.insecureSkipVerify); or not
    at all, for the reason in `refused`."""

    server_name: str
    context: ssl.SSLContext | None = None
    verified: bool = True
    refused: str | None = None


def pod_tls(
    namespace: str, name: str, tls: dict[str, Any] | None, ca: str | None, unreadable: str | None
) -> PodTls:
    """The operator's choice for the TLS pods of InferenceService `name`, from its spec.runtime.tls (as
    stored: camelCase) and what reading that Secret gave: its `ca.crt` (`ca`), or why it could not be read
    (`unreadable`). The pods' certificate is verified as Prometheus verifies it (scrape_tls): against the
    Secret's CA, for the Service's DNS name. Without a CA the calls are refused, not made unverified, unless
    the spec says insecureSkipVerify."""
    server_name = service_dns_name(name, namespace)
    if tls is None:
        return PodTls(
            server_name, refused=f"{SPEC_TLS} is unset, so the operator has no CA for this pod's TLS"
        )
    if tls.get("insecureSkipVerify"):
        return PodTls(server_name, unverified_context(), verified=False)
    secret = f"Secret {namespace}/{tls.get('secretName')}"
    if unreadable is not None:
        return PodTls(server_name, refused=f"cannot read {secret} for its {TLS_CA_KEY}: {unreadable}; {FIX}")
    if not ca:
        return PodTls(server_name, refused=f"{secret} has no {TLS_CA_KEY} to verify the pods against; {FIX}")
    try:
        return PodTls(server_name, verifying_context(ca))
    except (ssl.SSLError, ValueError) as exc:
        return PodTls(
            server_name, refused=f"the {TLS_CA_KEY} of {secret} is not a PEM certificate ({exc}); {FIX}"
        )


def verifying_context(ca: str) -> ssl.SSLContext:
    """A client context that trusts only `ca` (PEM, one or more certificates) and checks the server name."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=ca)
    return context


def unverified_context() -> ssl.SSLContext:
    """Encrypted but not authenticated: only with insecureSkipVerify."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
