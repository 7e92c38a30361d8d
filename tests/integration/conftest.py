"""Tier 2 fixtures: the real local control plane (e2e.fixtures), the InferenceService CRD, and the
operator started as a subprocess exactly as in production (`pagoda-operator`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from harness import OperatorProcess
from kubernetes import client

from e2e.fixtures import cluster, cluster_api, namespace, real_node, scratch  # noqa: F401
from e2e.lab.addons import wait_established
from e2e.lab.cluster import Cluster
from pagoda.operator.kube.client import Kube
from tests.repo import REPO

CRD_FILE = REPO / "crds" / "pagoda.dev_inferenceservices.yaml"
BUDGET_CRD_FILE = REPO / "crds" / "pagoda.dev_gpubudgets.yaml"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/integration" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def crd(cluster: Cluster) -> None:  # noqa: F811
    for path in (CRD_FILE, BUDGET_CRD_FILE):
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))
    wait_established(cluster, ["crd/inferenceservices.pagoda.dev", "crd/gpubudgets.pagoda.dev"], timeout=60)


@pytest.fixture(scope="session")
def operator(cluster: Cluster, crd: None, request: pytest.FixtureRequest) -> Iterator[OperatorProcess]:  # noqa: F811
    """The operator process for the session; its logs are kept (and named) when a test failed."""
    with scratch(request, "pagoda-operator-") as workdir:
        process = OperatorProcess(cluster.kubeconfig, workdir)
        process.start()
        try:
            yield process
        finally:
            process.stop()


@pytest.fixture
def kube(cluster_api: Any) -> client.CustomObjectsApi:  # noqa: F811
    return client.CustomObjectsApi(cluster_api)


@pytest.fixture
def raw(cluster_api: Any) -> Kube:  # noqa: F811
    """The operator's own thin client, for reading children as plain dicts."""
    return Kube(cluster_api)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    process = getattr(item, "funcargs", {}).get("operator")
    if report.failed and isinstance(process, OperatorProcess):
        lines = [line for line in process.log().splitlines() if not line.startswith(" ")]
        report.sections.append(("operator log (last 60 lines)", "\n".join(lines[-60:])))
    return report


@pytest.fixture(autouse=True)
def _operator_alive(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "operator" in request.fixturenames:
        process: OperatorProcess = request.getfixturevalue("operator")
        if process.proc is not None and process.proc.poll() is not None:
            pytest.fail(f"The operator died during the test; log:\n{process.log()[-4000:]}")
