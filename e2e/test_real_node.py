"""The real node (e2e/lab/realnode.py) as a user's cluster has one: kubelet and containerd from their Go
modules run Pagoda's images pulled from the local registry, the operator is installed from that registry with
`helm install oci://...` and works under the chart's RBAC, and Services answer through kube-proxy.

Every pod that does not ask for kwok's simulated nodes (tainted while a real node runs) lands on the real
node; see docs/local-cluster.md.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.lab import images, realnode, registry
from e2e.lab.chartenv import ChartOperator, adopt_crd, condition, helm, kubectl_json
from e2e.lab.cluster import Cluster, install_operator
from e2e.lab.processes import http_ok, wait_until
from e2e.lab.realpods import pods, port_forward, service_url, wait_condition
from e2e.lab.samples import tiny_sample
from pagoda.contract import HTTP_PORT

pytestmark = pytest.mark.e2e

RELEASE = "pagoda-real"
FULLNAME = RELEASE  # the chart's fullname: the release name, as it contains the chart's name
KUBELET_VERSION = "v1.36.3"
CONTAINERD_VERSION = "containerd://2.4.2"
RUNTIME_IMAGE = images.runtime_cpu_image()  # runtime/Dockerfile.cpu, `make images`
SERVICE = "tiny-real"
READY_TIMEOUT = 420.0  # the first pull of the 7 GB runtime image, then the engine's start on two cores


def _node(cluster: Cluster) -> dict[str, Any]:
    node: dict[str, Any] = kubectl_json(cluster, "get", "node", realnode.NODE_NAME)
    return node


@pytest.fixture(scope="module")
def workload(cluster: Cluster) -> Iterator[str]:
    """The namespace of the services, apart from the operator's (the production layout: the chart in its
    release namespace watches another). Yields its name."""
    namespace = f"llm-real-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    try:
        yield namespace
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def release(cluster: Cluster, workload: str) -> Iterator[str]:
    """The chart, as the cluster pushed it to the local registry, installed from there (`helm install
    oci://...`) into a namespace of its own; the operator watches only the `workload` namespace, and its
    NetworkPolicies admit the release's namespace and `monitoring` (the chart's default
    networkPolicy.allowFromNamespaces). Yields the release's namespace."""
    if cluster.node is None:
        pytest.fail("The session's cluster has no real node (e2e/conftest.py starts one).", pytrace=False)
    namespace = f"pagoda-real-{uuid.uuid4().hex[:6]}"
    adopt_crd(cluster, RELEASE, namespace)
    install_operator(cluster, RELEASE, namespace, values=(f"operator.watchNamespace={workload}",))
    try:
        yield namespace
    finally:
        helm(cluster, "uninstall", RELEASE, f"--namespace={namespace}", "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def _operator_pod(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """The pod of the operator replica that leads (the chart runs two; docs/operator.md#high-availability)."""
    return ChartOperator(cluster, namespace).pod()


def test_node_is_kubelet_and_containerd(cluster: Cluster) -> None:
    node = _node(cluster)
    info = node["status"]["nodeInfo"]
    assert info["kubeletVersion"] == KUBELET_VERSION
    assert info["containerRuntimeVersion"] == CONTAINERD_VERSION
    assert condition(node, "Ready").get("status") == "True"
    assert node["status"]["allocatable"].get("nvidia.com/gpu") == realnode.GPU_CAPACITY
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert cluster.node is not None
    assert addresses["InternalIP"] == cluster.node.address


def test_operator_runs_from_its_image_under_the_chart(cluster: Cluster, release: str) -> None:
    pod = _operator_pod(cluster, release)
    assert pod["spec"]["nodeName"] == realnode.NODE_NAME
    assert pod["spec"]["serviceAccountName"] == FULLNAME
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] is True
    # Pulled from the local registry through containerd's catch-all mirror: the digest is the one pushed.
    pushed = registry.pushed(cluster.workdir)
    reference = pod["spec"]["containers"][0]["image"]
    assert status["imageID"].endswith(pushed[reference]), (status["imageID"], pushed)
    # The chart's securityContext, enforced by runc and the kernel.
    assert_restricted(cluster, release, pod["metadata"]["name"])


def assert_restricted(cluster: Cluster, namespace: str, pod: str) -> None:
    """The pod's main process runs as uid/gid 65532 with no capabilities, no new privileges and a seccomp
    filter, on a read-only root filesystem, and the pod has no default route (only the pod and Service ranges,
    through the node): as runc and the kernel enforce it, read from /proc."""
    proc = cluster.kubectl("exec", "-n", namespace, pod, "--", "cat", "/proc/1/status")
    fields = dict(line.split(":\t", 1) for line in proc.stdout.splitlines() if ":\t" in line)
    assert fields["Uid"].split()[:2] == ["65532", "65532"]
    assert fields["Gid"].split()[:2] == ["65532", "65532"]
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"
    assert fields["Seccomp"].strip() == "2"
    write = cluster.kubectl("exec", "-n", namespace, pod, "--", "touch", "/x", check=False)
    assert write.returncode != 0 and "Read-only file system" in write.stderr
    routes = cluster.kubectl("exec", "-n", namespace, pod, "--", "cat", "/proc/net/route")
    destinations = [line.split()[1] for line in routes.stdout.splitlines()[1:]]
    assert destinations and "00000000" not in destinations, routes.stdout


def test_operator_reconciles_through_the_kubernetes_service(
    cluster: Cluster, release: str, workload: str
) -> None:
    """The operator pod reaches the API server through the `kubernetes` Service (kube-proxy's DNAT to the
    node's address) and does its work, in the namespace it watches, with the chart's permissions only."""
    sample = tiny_sample(workload, "tiny-real-node")
    cluster.kubectl("apply", "-f", "-", input=json.dumps(sample))

    def ready() -> dict[str, Any] | None:
        obj = kubectl_json(cluster, "get", "inferenceservice", "tiny-real-node", "-n", workload)
        return obj if condition(obj, "Ready").get("status") == "True" else None

    obj = wait_until(ready, "InferenceService tiny-real-node to be Ready", timeout=120)
    assert condition(obj, "Ready")["observedGeneration"] == obj["metadata"]["generation"]
    for kind in ("deployment", "service", "poddisruptionbudget"):
        kubectl_json(cluster, "get", kind, "tiny-real-node", "-n", workload)
    logs = cluster.kubectl("logs", "-n", release, _operator_pod(cluster, release)["metadata"]["name"]).stdout
    assert logs.strip(), "kubectl logs (API server -> kubelet -> the container's log file) gave nothing"
    assert "forbidden" not in logs.lower(), "the chart's RBAC lacks a permission the operator used"


def test_cluster_ip_answers_from_the_host(cluster: Cluster, release: str) -> None:
    service = kubectl_json(cluster, "get", "service", f"{FULLNAME}-metrics", "-n", release)
    ip, port = service["spec"]["clusterIP"], service["spec"]["ports"][0]["port"]
    assert ip.startswith("10.96.")
    wait_until(lambda: http_ok(f"http://{ip}:{port}/healthz") or None, f"{ip}:{port}/healthz", timeout=30)


# Resolves each name of argv in the pod as its programs do (the libc resolver: /etc/resolv.conf from the
# kubelet) and prints one JSON object: name -> [address or null, seconds].
RESOLVE = """
import json, socket, sys, time
found = {}
for name in sys.argv[1:]:
    began = time.monotonic()
    try:
        address = socket.gethostbyname(name)
    except OSError:
        address = None
    found[name] = [address, time.monotonic() - began]
print(json.dumps(found))
"""


def test_pods_resolve_service_names_through_cluster_dns(cluster: Cluster, release: str) -> None:
    """CoreDNS on the node answers the cluster's names for pods (the kubelet's clusterDNS and search path) and
    refuses every other name at once: nothing is forwarded, so a public name fails in well under a second."""
    service = f"{FULLNAME}-metrics"
    ip = kubectl_json(cluster, "get", "service", service, "-n", release)["spec"]["clusterIP"]
    api_ip = kubectl_json(cluster, "get", "service", "kubernetes", "-n", "default")["spec"]["clusterIP"]
    names = [
        service,
        f"{service}.{release}.svc",
        f"{service}.{release}.svc.cluster.local",
        "kubernetes.default",
    ]
    pod = _operator_pod(cluster, release)["metadata"]["name"]
    out = cluster.kubectl("exec", "-n", release, pod, "--", "python", "-c", RESOLVE, *names, "example.com")
    found = json.loads(out.stdout)
    assert {name: found[name][0] for name in names} == {
        service: ip,
        f"{service}.{release}.svc": ip,
        f"{service}.{release}.svc.cluster.local": ip,
        "kubernetes.default": api_ip,
    }, found
    address, seconds = found["example.com"]
    assert address is None and seconds < 1.0, found


def test_missing_image_fails_at_once_from_the_local_registry(cluster: Cluster, namespace: str) -> None:
    """Every registry is the local one: an image it lacks is ErrImagePull in seconds, never a lookup
    elsewhere (no DNS, no packet off the machine: the guard table dropped nothing)."""
    assert cluster.node is not None
    drops_before = cluster.node.guard_drops()
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "missing-image", "namespace": namespace},
        "spec": {
            "containers": [{"name": "c", "image": "docker.io/library/no-such-image:1"}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    began = time.monotonic()

    def pull_failed() -> str | None:
        obj = kubectl_json(cluster, "get", "pod", "missing-image", "-n", namespace)
        for status in obj.get("status", {}).get("containerStatuses") or []:
            reason = (status.get("state", {}).get("waiting") or {}).get("reason")
            if reason in ("ErrImagePull", "ImagePullBackOff"):
                return str(reason)
        return None

    wait_until(pull_failed, "missing-image to fail its pull", timeout=60)
    assert time.monotonic() - began < 30
    events = kubectl_json(cluster, "get", "events", "-n", namespace, "--field-selector=reason=Failed")
    messages = " ".join(e.get("message", "") for e in events["items"])
    # The local registry answered 404 (a lookup elsewhere would fail on DNS or time out instead).
    assert "code = NotFound" in messages, messages
    assert cluster.node.guard_drops() == drops_before


def _chat(url: str) -> tuple[int, dict[str, Any]]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}


@pytest.fixture(scope="module")
def served(cluster: Cluster, release: str, workload: str) -> dict[str, Any]:
    """examples/tiny-cpu.yaml on the real node, from the CPU runtime image, in the namespace the operator
    watches; returns its Ready pod."""
    cluster.kubectl("apply", "-f", "-", input=json.dumps(tiny_sample(workload, SERVICE, real_pods=True)))
    wait_condition(cluster, workload, SERVICE, "Ready", timeout=READY_TIMEOUT)
    (pod,) = pods(cluster, workload, SERVICE)
    return pod


def test_runtime_image_serves_chat_through_its_service(
    cluster: Cluster, workload: str, served: dict[str, Any]
) -> None:
    """The runtime pod runs from the CPU image on the real node with the operator's securityContext, and a
    chat request crosses its ClusterIP Service (kube-proxy) and `kubectl port-forward` (the kubelet's
    streaming through containerd)."""
    assert served["spec"]["nodeName"] == realnode.NODE_NAME
    status = served["status"]["containerStatuses"][0]
    assert status["image"] == RUNTIME_IMAGE and status["restartCount"] == 0
    assert status["imageID"].endswith(registry.pushed(cluster.workdir)[RUNTIME_IMAGE])
    # The pod is Ready; kube-proxy programs its endpoint a moment later (until then the ClusterIP refuses).
    url = service_url(cluster, workload, SERVICE, timeout=30)
    code, answer = _chat(url)
    assert code == 200 and answer["choices"][0]["message"]["content"] is not None, answer
    with port_forward(cluster, workload, f"service/{SERVICE}", HTTP_PORT) as local:
        code, answer = _chat(local)
    assert code == 200 and answer["usage"]["completion_tokens"] > 0, answer
    logs = cluster.kubectl("logs", "-n", workload, served["metadata"]["name"]).stdout
    assert logs.strip(), "kubectl logs gave nothing for the runtime"
    # The operator's pod template, enforced: the engine served all of that with a read-only root filesystem,
    # and without a service account token to steal (the runtime never calls the API).
    assert_restricted(cluster, workload, served["metadata"]["name"])
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    look = cluster.kubectl(
        "exec", "-n", workload, served["metadata"]["name"], "--", "cat", token, check=False
    )
    assert look.returncode != 0 and "No such file or directory" in look.stderr, look.stderr


# Run in a pod: prints the HTTP status of a GET, or the name of the error (a dropped SYN: a timeout).
PROBE = """
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=float(sys.argv[2])) as answer:
        print(answer.status)
except Exception as exc:
    print(type(exc).__name__)
"""
PROBE_TIMEOUT_S = 3.0


def _probe(cluster: Cluster, namespace: str, pod: str, url: str) -> str:
    argv = ["exec", "-n", namespace, pod, "--", "python", "-c", PROBE, url, str(PROBE_TIMEOUT_S)]
    return str(cluster.kubectl(*argv).stdout.strip())


def _client_pod(cluster: Cluster, namespace: str, name: str, image: str) -> None:
    """A pod of `image` (one with Python) that sleeps, Ready in `namespace`, to probe from."""
    client = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "c", "image": image, "command": ["python", "-c", "import time; time.sleep(3600)"]}
            ],
            "terminationGracePeriodSeconds": 0,
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(client))
    cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", namespace, "--timeout=120s")


def test_network_policy_admits_the_operator_and_monitoring_and_refuses_a_third_namespace(
    cluster: Cluster, release: str, workload: str, served: dict[str, Any]
) -> None:
    """The production layout, enforced by kube-network-policies on the node: the operator in its release
    namespace, the service in the namespace it watches, a scraper in `monitoring` (Prometheus's namespace;
    the policy admits by namespace, not by program), a client in a third namespace. The operator's pod
    reaches the runtime and has read its capacity through the policy; the scraper gets /metrics; the third
    namespace's pod, whose network works (it reaches the operator's metrics Service), is refused at the
    runtime's port until spec.networkPolicy.allowFrom names its namespace."""
    runtime = f"http://{served['status']['podIP']}:{HTTP_PORT}"
    operator = _operator_pod(cluster, release)
    assert _probe(cluster, release, operator["metadata"]["name"], f"{runtime}/livez") == "200"
    wait_until(
        lambda: (
            kubectl_json(cluster, "get", "inferenceservice", SERVICE, "-n", workload)
            .get("status", {})
            .get("capacity")
        ),
        "the operator to read the pod's capacity (status.capacity) through the NetworkPolicy",
        timeout=60,
    )

    image = operator["spec"]["containers"][0]["image"]  # on the node already, and it has Python
    scraper = f"scraper-{uuid.uuid4().hex[:6]}"
    existed = cluster.kubectl("get", "namespace", "monitoring", check=False).returncode == 0
    if not existed:
        cluster.kubectl("create", "namespace", "monitoring")
    outsider = f"outsider-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", outsider)
    try:
        _client_pod(cluster, "monitoring", scraper, image)
        assert _probe(cluster, "monitoring", scraper, f"{runtime}/metrics") == "200"
        _client_pod(cluster, outsider, "client", image)
        metrics = f"http://{FULLNAME}-metrics.{release}.svc:8080/healthz"
        assert _probe(cluster, outsider, "client", metrics) == "200"  # its network works: no policy there
        for path in ("/livez", "/metrics", "/v1/models"):
            assert _probe(cluster, outsider, "client", f"{runtime}{path}") in ("URLError", "TimeoutError")
        allow = {"spec": {"networkPolicy": {"allowFrom": [{"namespace": outsider}]}}}
        cluster.kubectl(
            "patch", "inferenceservice", SERVICE, "-n", workload, "--type=merge", "-p", json.dumps(allow)
        )
        wait_until(
            lambda: _probe(cluster, outsider, "client", f"{runtime}/livez") == "200",
            "the pod of the allowed namespace to reach the runtime",
            timeout=60,
        )
    finally:
        revert = {"spec": {"networkPolicy": None}}
        cluster.kubectl(
            "patch", "inferenceservice", SERVICE, "-n", workload, "--type=merge", "-p", json.dumps(revert)
        )
        cluster.kubectl("delete", "namespace", outsider, "--wait=false", check=False)
        if existed:
            cluster.kubectl("delete", "pod", scraper, "-n", "monitoring", "--wait=false", check=False)
        else:
            cluster.kubectl("delete", "namespace", "monitoring", "--wait=false", check=False)


def test_make_release_publishes_what_the_chart_installs(cluster: Cluster) -> None:
    """`make release` to a registry (here the local one, under a path of its own): the images under
    PREFIX/<name>:<version>, each manifest the one `make release` says it pushed, and a chart whose default
    operator image is the released tag. The path is fixed, so that a warm run finds the layers there (the
    local registry's storage outlives clusters) and uploads no 7 GB again."""
    version = registry.chart_version()
    prefix = f"{cluster.urls['registry']}/release-test"
    make = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "release",
            f"REGISTRY={prefix}",
            f"VERSION={version}",
            "PLAIN_HTTP=1",
        ],
        cwd=registry.CHART_DIR.parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert make.returncode == 0, make.stdout + make.stderr
    host, _, path = prefix.partition("/")
    said = dict(line.split()[1:3] for line in make.stdout.splitlines() if line.startswith("Pushed "))
    built = {str(i["name"]): str(i["references"][0]) for i in registry.images()}
    for name in registry.RELEASED_IMAGES:
        tag = built[name].rsplit("/", 1)[1]
        digest = said.get(f"{prefix}/{tag}")
        assert digest and digest.startswith("sha256:"), (tag, make.stdout)
        assert registry.manifest_digest(host, f"{path}/{tag}") == digest, (
            f"{prefix}/{tag} is not what was pushed"
        )
    shown = helm(
        cluster, "show", "chart", f"oci://{prefix}/charts/pagoda", f"--version={version}", "--plain-http"
    )
    chart = yaml.safe_load(shown.stdout)
    assert chart["version"] == version and chart["appVersion"] == version
    refused = subprocess.run(
        ["make", "--no-print-directory", "release", f"REGISTRY={prefix}", "VERSION=9.9.9", "PLAIN_HTTP=1"],
        cwd=registry.CHART_DIR.parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert refused.returncode != 0 and "Chart.yaml has version: " in refused.stderr, refused.stderr
