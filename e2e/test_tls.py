"""spec.runtime.tls on the real node: a `tiny` service (examples/tiny-cpu.yaml) in a `restricted` namespace
whose pods serve HTTPS with a certificate from a kubernetes.io/tls Secret (cert-manager's key names), written
here as cert-manager would write it.

1. The pod is admitted and Ready from its own HTTPS probes (the kubelet reads the Secret volume as user
   65532 through fsGroup, mode 0440); plain HTTP to the pod IP gets no HTTP answer; a chat completion over
   HTTPS, verified against the Secret's ca.crt and the Service's DNS name, works through the Service's
   ClusterIP; the operator's calls to the pod over HTTPS, verified against the Secret's ca.crt (a Role lets
   it read that one Secret), fill status.capacity.
2. The Prometheus Operator's Prometheus (the stack's) scrapes the pod over HTTPS through the ServiceMonitor
   the operator writes (`tlsConfig`: the Secret's ca.crt, the Service's DNS name), which the operator copies
   into the Prometheus pod's TLS assets.
3. The Secret is renewed in place (a new key and certificate, as cert-manager renews): the kubelet swaps the
   mounted files, and within its sync period a new connection is shown the new certificate by the same
   container (restartCount 0).
"""

from __future__ import annotations

import base64
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509

from e2e.lab._pki import TlsDir, write_tls_dir
from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import Cluster
from e2e.lab.observability import PrometheusAt
from e2e.lab.processes import WaitTimeout, wait_until
from e2e.lab.realpods import apply, get_json, ready_pods, wait_condition, wait_ready_replicas
from e2e.lab.samples import tiny_sample
from e2e.lab.stack import Stack
from pagoda.contract import HTTP_PORT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # real engines start slowly on two cores
NAMESPACE = "tls"
SECRET = "tiny-tls"
DNS_NAME = f"tiny.{NAMESPACE}.svc"


def issue(directory: Path, common_name: str) -> TlsDir:
    """A CA and a certificate for the Service's names. Each call makes another CA, named after
    `common_name`: two CAs of one name in a trust store would be one to OpenSSL."""
    return write_tls_dir(directory, common_name, ["tiny", f"tiny.{NAMESPACE}", DNS_NAME], [])


def secret(tls: TlsDir) -> dict[str, Any]:
    files = {name: (tls.directory / name).read_bytes() for name in ("tls.crt", "tls.key", "ca.crt")}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": SECRET, "namespace": NAMESPACE},
        "data": {name: base64.b64encode(data).decode() for name, data in files.items()},
    }


def serial_of(tls: TlsDir) -> int:
    return x509.load_pem_x509_certificate(tls.cert.read_bytes()).serial_number


def peer_serial(address: str, trust: ssl.SSLContext) -> int:
    """A new TLS connection to `address` (a pod IP or the ClusterIP), verified against `trust` and the
    Service's DNS name (which is what the certificate names): the serial it was shown."""
    with socket.create_connection((address, HTTP_PORT), timeout=10) as raw:
        with trust.wrap_socket(raw, server_hostname=DNS_NAME) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def ca_readable(operator_namespace: str) -> list[dict[str, Any]]:
    """What docs/install.md asks of a namespace with TLS services: let the operator `get` the one Secret,
    whose ca.crt it verifies the pods' certificate against before it calls them (the chart grants no read of
    Secrets)."""
    name = "pagoda-operator-tls-ca"
    rule = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get"]}
    subject = {"kind": "ServiceAccount", "name": "pagoda", "namespace": operator_namespace}
    role_ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    meta = {"name": name, "namespace": NAMESPACE}
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": [rule]},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": role_ref,
            "subjects": [subject],
        },
    ]


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> tuple[TlsDir, TlsDir]:
    root = tmp_path_factory.mktemp("tls")
    return issue(root / "first", "tiny"), issue(root / "renewed", "tiny-renewed")


@pytest.fixture(scope="module")
def serving(cluster: Cluster, operator: ChartOperator, certificates: tuple[TlsDir, TlsDir]) -> Iterator[str]:
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    apply(cluster, secret(certificates[0]))
    for obj in ca_readable(operator.namespace):
        apply(cluster, obj)
    sample = tiny_sample(NAMESPACE, real_pods=True)
    sample["spec"]["replicas"] = 1
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900  # engines start slowly on two shared cores
    sample["spec"]["runtime"]["tls"] = {"secretName": SECRET}
    sample["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "2s"}}
    apply(cluster, sample)
    try:
        wait_condition(cluster, NAMESPACE, "tiny", "Ready", timeout=480)
        wait_ready_replicas(cluster, NAMESPACE, "tiny", 1)
        yield NAMESPACE
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def trusting(*certificates: TlsDir) -> ssl.SSLContext:
    context = ssl.create_default_context()
    for tls in certificates:
        context.load_verify_locations(cafile=str(tls.ca_cert))
    return context


def test_the_pod_serves_https_verified_against_the_secrets_ca(
    cluster: Cluster, serving: str, certificates: tuple[TlsDir, TlsDir]
) -> None:
    first, _ = certificates
    trust = trusting(first)
    (pod,) = ready_pods(cluster, serving, "tiny")
    ip = pod["status"]["podIP"]
    (container,) = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    with pytest.raises(httpx.TransportError):  # no HTTP answer on the TLS port
        httpx.get(f"http://{ip}:{HTTP_PORT}/readyz", timeout=10)
    assert peer_serial(ip, trust) == serial_of(first)

    service = get_json(cluster, "-n", serving, "service", "tiny")
    assert service["spec"]["ports"][0]["appProtocol"] == "https"
    cluster_ip = service["spec"]["clusterIP"]
    assert peer_serial(cluster_ip, trust) == serial_of(first)
    # httpx checks the name in the URL: the ClusterIP is not in the certificate, so the name is given as the
    # TLS server name (SNI and verification) while the connection goes to the ClusterIP.
    with httpx.Client(verify=trust, timeout=120) as client:
        reply = client.post(
            f"https://{cluster_ip}:{HTTP_PORT}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8},
            extensions={"sni_hostname": DNS_NAME},
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] > 0

    # The operator reached the pod over HTTPS: status.capacity comes from GET /v1/pagoda/capacity on it.
    def capacity() -> dict[str, Any] | None:
        found: dict[str, Any] | None = get_json(cluster, "-n", serving, "inferenceservice", "tiny")[
            "status"
        ].get("capacity")
        return found

    assert wait_until(capacity, "status.capacity", timeout=120, interval=1)["kvCacheTokens"] > 0


def test_prometheus_scrapes_the_pod_over_https_through_the_service_monitor(
    cluster: Cluster, serving: str, stack: Stack
) -> None:
    monitor = get_json(cluster, "-n", serving, "servicemonitor", "tiny")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["tlsConfig"]["serverName"] == DNS_NAME, endpoint
    (pod,) = ready_pods(cluster, serving, "tiny")
    wanted = f"https://{pod['status']['podIP']}:{HTTP_PORT}/metrics"

    def scraped() -> dict[str, Any] | None:
        targets = PrometheusAt(stack.prometheus_url).api("targets")["activeTargets"]
        found = [t for t in targets if t["labels"].get("namespace") == serving and t["scrapeUrl"] == wanted]
        return found[0] if found and found[0]["health"] == "up" else None

    try:
        target = wait_until(scraped, f"Prometheus to scrape {wanted}", timeout=120, interval=2)
    except WaitTimeout:
        targets = PrometheusAt(stack.prometheus_url).api("targets")["activeTargets"]
        raise AssertionError([t for t in targets if t["labels"].get("namespace") == serving]) from None
    assert target["labels"]["service"] == "tiny", target
    [up] = PrometheusAt(stack.prometheus_url).query(f'up{{namespace="{serving}", service="tiny"}}')
    assert up["value"][1] == "1", up


def test_a_renewed_certificate_reaches_new_connections_without_a_restart(
    cluster: Cluster, serving: str, certificates: tuple[TlsDir, TlsDir]
) -> None:
    first, renewed = certificates
    trust = trusting(first, renewed)
    (pod,) = ready_pods(cluster, serving, "tiny")
    ip, uid = pod["status"]["podIP"], pod["metadata"]["uid"]
    apply(cluster, secret(renewed))
    # The kubelet's sync period (10 s on the harness's node, e2e/lab/realnode.py), then the runtime's 5 s
    # look.
    wait_until(
        lambda: peer_serial(ip, trust) == serial_of(renewed),
        "the pod showing the renewed certificate",
        timeout=240,
        interval=2,
    )
    (after,) = ready_pods(cluster, serving, "tiny")
    assert after["metadata"]["uid"] == uid
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
