"""pytest fixtures for tests against the real local control plane.

`cluster` (session): a private control plane in a temp dir, or the one at $PAGODA_KUBECONFIG.
`second_node` (module): pagoda-kubelet-1 beside the real node, for the tests that need two; removed after.
`namespace` (function): a fresh namespace, deleted afterwards.
`scratch(request, prefix)`: a fixture's temp folder, removed after it unless a test failed meanwhile.
Re-export them from a conftest.py:  from e2e.fixtures import cluster, namespace, real_node  # noqa: F401
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e.lab import _objects, realnode
from e2e.lab.chartenv import ChartOperator, adopt_crd, helm
from e2e.lab.cluster import (
    OPERATOR_RELEASE,
    Cluster,
    ToolsMissingError,
    check_bin_dir,
    default_bin_dir,
    install_operator,
    start_private,
)
from e2e.lab.processes import discard_folder
from e2e.lab.stack import Stack, start_stack


@contextlib.contextmanager
def scratch(request: pytest.FixtureRequest, prefix: str) -> Iterator[Path]:
    """A temporary folder for a fixture's files (logs, a git repository): removed when the fixture ends,
    unless a test failed while it lived; then kept, and named, for its logs."""
    failed_before = request.session.testsfailed
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        discard_folder(path, request.session.testsfailed > failed_before, "a failed test's files")


@pytest.fixture(scope="session")
def real_node() -> bool:
    """Whether the session's cluster has a real node (kubelet + containerd, the local registry). Tier 2
    runs without one; e2e/conftest.py overrides this for tier 4."""
    return False


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest, real_node: bool) -> Iterator[Cluster]:
    bin_dir = default_bin_dir()
    try:
        check_bin_dir(bin_dir, real_node)
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    reuse = os.environ.get("PAGODA_KUBECONFIG")
    if reuse:
        yield Cluster.from_kubeconfig(Path(reuse), bin_dir)
        return
    began = time.monotonic()
    instance = start_private(bin_dir, real_node=real_node)
    print(
        f"\nStarted the local control plane at {instance.server} in {time.monotonic() - began:.1f}s "
        f"(workdir {instance.workdir})."
    )
    try:
        yield instance
    finally:
        nodes = instance.real_nodes  # node 0 and any second node a test left running
        instance.stop()
        for node in nodes:  # `down` leaves nothing behind: no process, mount, cgroup, link or table
            left = realnode.leftovers(node)
            assert not left, f"The real node {node.name} left these behind: {left}"
        instance.discard(failed=request.session.testsfailed > 0)


@pytest.fixture(scope="session")
def stack(cluster: Cluster) -> Iterator[Stack]:
    """The add-ons (KEDA, kube-state-metrics, Prometheus synced with the ServiceMonitors) on the session's
    private cluster. Not with $PAGODA_KUBECONFIG: a cluster from `make cluster-up` runs its own."""
    if os.environ.get("PAGODA_KUBECONFIG"):
        pytest.fail("Tests that use the add-ons start them on a private cluster: unset PAGODA_KUBECONFIG.")
    running = start_stack(cluster)
    try:
        yield running
    finally:
        running.stop()


SECOND_NODE_TIMEOUT = 120.0


@pytest.fixture(scope="module")
def second_node(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[realnode.RealNode]:
    """A second real node, pagoda-kubelet-1, beside the session's (Cluster.add_node): its own containerd,
    kubelet, cgroup root, bridge and /24, served by node 0's kube-proxy, CoreDNS and NetworkPolicy agent.
    Only for the modules that ask for it: its containerd starts with an empty store, so each image its pods
    run is pulled from the local registry again (the 7 GB runtime image: minutes). A module whose pods run
    the runtime there sets `SECOND_NODE_PREPULL = <image>`: the kubelet then pulls it in the background from
    the start (realnode.prepull), while the module's first tests run. Removed after the module (cordoned, its
    pods deleted, its processes ended), and it must leave nothing behind."""
    if os.environ.get("PAGODA_KUBECONFIG"):
        pytest.fail("The second node joins a private cluster: unset PAGODA_KUBECONFIG.", pytrace=False)
    if cluster.node is None:
        pytest.fail("A second real node joins the first (tier 4's cluster).", pytrace=False)
    began = time.monotonic()
    prepull = getattr(request.module, "SECOND_NODE_PREPULL", None)
    node = cluster.add_node(timeout=SECOND_NODE_TIMEOUT, prepull=prepull)
    # Node 1's containerd keeps its own copy of each image (the runtime's: about 7 GB packed, more unpacked);
    # a disk that fills up makes a kubelet taint its node disk-pressure, and the scheduler then skips it.
    free = shutil.disk_usage(cluster.workdir).free / 2**30
    took = time.monotonic() - began
    print(f"\nStarted {node.name} at {node.network.address} in {took:.1f}s ({free:.0f} GiB free on disk).")
    try:
        yield node
    finally:
        cluster.remove_node(node.name)
        left = realnode.leftovers(node.network)
        assert not left, f"{node.name} left these behind: {left}"


@contextlib.contextmanager
def chart_operator(cluster: Cluster, values: tuple[str, ...] = ()) -> Iterator[ChartOperator]:
    """Pagoda installed as a user installs it: the chart from the local registry (`helm install oci://...`)
    in a namespace of its own, its operator a pod on the real node under the chart's RBAC (watching every
    namespace), its services running the CPU runtime image; `values`: more `--set` arguments. Uninstalled
    afterwards; the CRD stays."""
    if cluster.node is None:
        pytest.fail("The chart's operator runs on the real node (tier 4's cluster).", pytrace=False)
    namespace = f"pagoda-system-{uuid.uuid4().hex[:6]}"
    adopt_crd(cluster, OPERATOR_RELEASE, namespace)
    install_operator(cluster, OPERATOR_RELEASE, namespace, values)
    running = ChartOperator(cluster, namespace)
    try:
        yield running
        running.check_alive()
    finally:
        helm(cluster, "uninstall", OPERATOR_RELEASE, "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[ChartOperator]:
    """The chart's operator (`chart_operator`), once per test module."""
    with chart_operator(cluster) as running:
        yield running


@pytest.fixture(scope="session")
def cluster_api(cluster: Cluster) -> Iterator[Any]:
    """One kubernetes.client.ApiClient (admin) for the session."""
    api = cluster.api_client()
    try:
        yield api
    finally:
        api.close()


def _namespace_name(test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"t-{slug}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def namespace(cluster_api: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace (its default ServiceAccount exists, so pods can be created); deleted after."""
    name = _namespace_name(request.node.name)
    body = {"metadata": {"name": name, "labels": {"pagoda.dev/test": "true"}}}
    status, result = _objects.request(cluster_api, "POST", "/api/v1/namespaces", body)
    assert status == 201, f"Creating namespace {name} failed ({status}): {result}"
    try:
        _objects.wait_service_account(None, cluster_api, name, time.monotonic() + 60)
        yield name
    finally:
        _objects.request(cluster_api, "DELETE", f"/api/v1/namespaces/{name}")
