"""pytest fixtures for tests against the real local control plane.

`cluster` (session): a private control plane in a temp dir, or the one at $PAGODA_KUBECONFIG.
`namespace` (function): a fresh namespace, deleted afterwards.
Re-export them from a conftest.py:  from e2e.fixtures import cluster, namespace  # noqa: F401
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from e2e import _objects
from e2e.cluster import Cluster, ToolsMissingError, check_bin_dir, default_bin_dir, start_private


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    bin_dir = default_bin_dir()
    try:
        check_bin_dir(bin_dir)
    except ToolsMissingError as exc:
        pytest.fail(str(exc), pytrace=False)
    reuse = os.environ.get("PAGODA_KUBECONFIG")
    if reuse:
        yield Cluster.from_kubeconfig(Path(reuse), bin_dir)
        return
    began = time.monotonic()
    instance = start_private(bin_dir)
    print(
        f"\nStarted the local control plane at {instance.server} in {time.monotonic() - began:.1f}s "
        f"(workdir {instance.workdir})."
    )
    try:
        yield instance
    finally:
        instance.stop()
        if request.session.testsfailed == 0:
            shutil.rmtree(instance.workdir, ignore_errors=True)
        else:
            print(f"\nKept the local control plane's logs in {instance.workdir / 'logs'}.")


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
