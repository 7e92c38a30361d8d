"""The inference API of a pod of the CPU runtime image, as a client reaches it through its Service, with
`spec.runtime.apiKeySecret` set (docs/security.md, "The inference API"):

1. Every parameter vLLM serves on chat and completions (e2e/lab/openai_surface.py), through the official
`openai`
   client with the key: each served with its effect shown, or refused with a 4xx; the pod never restarts
   (one `logprobs` request killed the image's EngineCore: torch's inductor found no C++ compiler).
2. Without the key, or with a wrong one, no route of vLLM's pinned version answers: every one it can mount
   (enumerated from vLLM's own app, so a route a new vLLM adds is tried too) gets 401 or 404, among them
   SageMaker's `POST /invocations`, which ran chat with no key, and the development routes.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from e2e.lab import openai_surface
from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import Cluster
from e2e.lab.processes import VENV_BIN
from e2e.lab.realpods import apply, get_json, ready_pods, wait_condition, wait_ready_replicas
from e2e.lab.samples import tiny_sample
from pagoda.contract import HTTP_PORT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # real engines start slowly on two cores
NAMESPACE = "api-surface"
SECRET = "tiny-api-key"
# Pagoda's own paths, open by design (the kubelet's probes and Prometheus carry no key: docs/security.md).
OPEN_PATHS = {"/livez", "/readyz", "/metrics"}


@pytest.fixture(scope="module")
def api_key() -> str:
    return secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def service_url(cluster: Cluster, operator: ChartOperator, api_key: str) -> Iterator[str]:
    """The `tiny` sample with an API key, one replica on the real node; its Service's URL."""
    cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    key_secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NAMESPACE}}
    apply(cluster, {**key_secret, "stringData": {"api-key": api_key}})
    sample = tiny_sample(NAMESPACE, real_pods=True)
    sample["spec"]["replicas"] = 1
    sample["spec"]["runtime"]["startupTimeoutSeconds"] = 900  # engines start slowly on two shared cores
    sample["spec"]["runtime"]["apiKeySecret"] = {"name": SECRET}
    apply(cluster, sample)
    try:
        wait_condition(cluster, NAMESPACE, "tiny", "Ready", timeout=480)
        wait_ready_replicas(cluster, NAMESPACE, "tiny", 1)
        cluster_ip = get_json(cluster, "-n", NAMESPACE, "service", "tiny")["spec"]["clusterIP"]
        yield f"http://{cluster_ip}:{HTTP_PORT}"
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")


def the_pod(cluster: Cluster) -> dict[str, Any]:
    (pod,) = ready_pods(cluster, NAMESPACE, "tiny")
    return pod


def restarts(pod: dict[str, Any]) -> int:
    return int(pod["status"]["containerStatuses"][0]["restartCount"])


def test_every_openai_parameter_is_served_or_refused_and_the_pod_never_restarts(
    cluster: Cluster, service_url: str, api_key: str
) -> None:
    before = the_pod(cluster)
    client = openai.OpenAI(base_url=f"{service_url}/v1", api_key=api_key, timeout=120, max_retries=0)
    wrong = openai_surface.sweep(client)
    assert not wrong, "\n".join(map(str, wrong))
    after = the_pod(cluster)
    assert after["metadata"]["uid"] == before["metadata"]["uid"]
    assert restarts(after) == restarts(before) == 0, after["status"]["containerStatuses"]


def test_no_vllm_route_answers_without_the_key(cluster: Cluster, service_url: str, api_key: str) -> None:
    routes = openai_surface.vllm_routes(str(VENV_BIN / "python"), "/models/tiny")
    assert ("POST", "/invocations") in routes and ("POST", "/v1/chat/completions") in routes, routes
    answered: dict[str, list[str]] = {}
    with httpx.Client(base_url=service_url, timeout=30) as client:
        for headers in ({}, {"Authorization": f"Bearer {api_key}x"}, {"Authorization": "Basic Zm9vOmJhcg=="}):
            for method, path in routes:
                if path in OPEN_PATHS:
                    continue
                reply = client.request(method, path, headers=headers, json={"model": "tiny", "prompt": "hi"})
                if reply.status_code not in (401, 404):
                    answered.setdefault(f"{method} {path}", []).append(f"{reply.status_code} {headers}")
        assert not answered, answered
        # The key itself still opens the inference API (not everything refused).
        models = client.get("/v1/models", headers={"Authorization": f"Bearer {api_key}"})
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["tiny"]
    assert restarts(the_pod(cluster)) == 0
