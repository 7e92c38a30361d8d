"""Pagoda upgraded from its last release to this commit, and rolled back, under load
(docs/install.md#upgrading, docs/design/2026-12-06-operator-upgrades.md).

The last release in RELEASES.md (0.1.0) is built from a worktree of its commit and pushed to the local
registry (e2e/lab/releases.py), and installed as a user would: `helm install oci://... --version 0.1.0`. Three
services on it, each one real replica of the CPU runtime: one autoscaled (KEDA, a target its load never
reaches), one with a LoRA adapter, one routed (its endpoint picker, and Envoy in front of it as the gateway).
Clients that keep their connections and never retry send to each Service's ClusterIP, to the adapter, and
through the gateway, from before the upgrade to after the rollback.

1. `helm upgrade` to this commit's chart (from the same registry). The new operator's pod template differs
   from 0.1.0's (its runtime image, a topology spread), not the services' specs: the fleet's rollout budget
   (rollouts.maxConcurrent, default 1) rolls them one at a time. Sampled every second: never more than one
   Deployment rolling, each service's one replica replaced once and by a rollout the budget granted (the
   Deployment carries pagoda.dev/fleet-rollout), no container restarted, and each service seen managed by the
   new operator (its status.podTemplateInputs) while its only Ready pod still ran 0.1.0's runtime: Ready, the
   adapter loaded through the new operator's management calls (version skew); after it every service is Ready
   on the new runtime image with its status current (observedGeneration, podTemplateInputs), the adapter
   loaded, the specs as they were (the CRD upgraded in place, no InferenceService lost or rewritten), no Job
   created.
2. `helm rollback` to 0.1.0: its operator, which has no rollout budget, rolls all three back to its runtime
   image at once (the node's 4 fake GPUs let at most one surge pod start at a time, so they go one after
   another anyway); every service Ready again on 0.1.0's image, the adapter loaded, the specs as they were.
Through all of it no request fails. No service has spec.slo: that an upgrade starts no profile Job is
tests/integration/test_operator_upgrade.py's (a profile takes minutes of this machine's two cores).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from e2e.lab import images, registry, releases
from e2e.lab.chartenv import adopt_crd, helm
from e2e.lab.cluster import OPERATOR_RELEASE, Cluster, install_operator
from e2e.lab.gateway import start_gateway
from e2e.lab.observability import Load
from e2e.lab.processes import wait_until
from e2e.lab.realpods import apply, condition, get_json, is_ready, service_url
from e2e.lab.samples import tiny_sample
from e2e.lab.stack import Stack
from pagoda.operator.kube.client import Kube
from pagoda.operator.reconcile.rollouts import FLEET_ROLLOUT_ANNOTATION
from pagoda.operator.resources.meta import APP_NAME, OWNER_LABEL

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

SCALED, ADAPTED, ROUTED = "scaled", "adapted", "routed"
SERVICES = (SCALED, ADAPTED, ROUTED)
ADAPTER = "sql"  # the CPU runtime image carries it for its tiny model (runtime/Dockerfile.cpu)
ROLLOUT_BUDGET = 1  # the chart's rollouts.maxConcurrent, by default
ROLL_TIMEOUT = 900.0  # three rollouts, one engine start each, beside three engines serving load
# The services' runtime pods (their pickers' carry the component label).
RUNTIME_PODS = f"app.kubernetes.io/name={APP_NAME},app.kubernetes.io/component!=endpoint-picker"


def service(namespace: str, name: str) -> dict[str, Any]:
    """examples/tiny-cpu.yaml as `name`, one replica, small requests: three of them and a surge pod fit the
    real node's two cores and memory (requests, not limits: the engines use idle cores)."""
    obj = tiny_sample(namespace, name, real_pods=True)
    spec = obj["spec"]
    spec["resources"]["cpu"] = "100m"
    spec["resources"]["memory"] = "3Gi"
    spec["runtime"]["startupTimeoutSeconds"] = 600
    if name == SCALED:
        spec.pop("replicas")
        spec["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "5s"}}
        spec["autoscaling"] = {"minReplicas": 1, "maxReplicas": 2, "metric": "InFlight", "targetInFlight": 64}
    if name == ADAPTED:
        spec["lora"] = {
            "maxLoras": 1,
            "maxLoraRank": 8,
            "maxCpuLoras": 1,
            "adapters": [{"name": ADAPTER, "uri": f"file:///models/adapters/{ADAPTER}"}],
        }
    if name == ROUTED:
        spec["routing"] = {"endpointPicker": {"cpu": "100m"}}
    return obj


@dataclass
class Fleet:
    """What a sampler saw of the services, their Deployments and runtime pods, once a second."""

    most_rolling: int = 0
    pods: dict[str, set[str]] = field(default_factory=lambda: {name: set() for name in SERVICES})
    restarts: dict[str, int] = field(default_factory=dict)  # pod -> the highest restartCount seen
    queued: set[str] = field(default_factory=set)  # services seen with RolloutQueued True
    not_ready: set[str] = field(default_factory=set)  # "service: reason" of each Ready False seen
    # Services seen managed by the new operator (its status.podTemplateInputs) while every Ready pod of them
    # ran the earlier runtime: Ready, status current, the adapter loaded through its management calls.
    skew: set[str] = field(default_factory=set)
    samples: int = 0


def rolling(deployment: dict[str, Any]) -> bool:
    status = deployment.get("status") or {}
    want = int(deployment["spec"].get("replicas", 1))
    updated = int(status.get("updatedReplicas") or 0)
    return (
        int(status.get("observedGeneration") or 0) < int(deployment["metadata"]["generation"])
        or updated < want
        or int(status.get("replicas") or 0) > updated
    )


@dataclass
class Sampler:
    """Samples the services every second (through one API client: three kubectl runs a second would take a
    fifth of a core from the engines)."""

    kube: Kube
    namespace: str
    new_image: str | None = None  # the runtime image of this commit's operator, on an upgrade (`Fleet.skew`)
    fleet: Fleet = field(default_factory=Fleet)
    stop: threading.Event = field(default_factory=threading.Event)
    error: list[BaseException] = field(default_factory=list)

    def sample(self) -> None:
        deployments = self.kube.list("apps/v1", "deployments", self.namespace)
        runtime = [d for d in deployments if d["metadata"]["name"] in SERVICES]
        self.fleet.most_rolling = max(self.fleet.most_rolling, sum(1 for d in runtime if rolling(d)))
        ready_images: dict[str, set[str]] = {name: set() for name in SERVICES}
        for pod in self.kube.list("v1", "pods", self.namespace, RUNTIME_PODS):
            owner = pod["metadata"]["labels"][OWNER_LABEL]
            self.fleet.pods[owner].add(pod["metadata"]["name"])
            if is_ready(pod):
                ready_images[owner].add(pod["spec"]["containers"][0]["image"])
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                name = pod["metadata"]["name"]
                self.fleet.restarts[name] = max(self.fleet.restarts.get(name, 0), int(status["restartCount"]))
        for s in self.kube.list("pagoda.dev/v1alpha1", "inferenceservices", self.namespace):
            name, status = s["metadata"]["name"], s.get("status") or {}
            if condition(s, "RolloutQueued").get("status") == "True":
                self.fleet.queued.add(name)
            ready = condition(s, "Ready")
            if ready.get("status") != "True":
                self.fleet.not_ready.add(f"{name}: {ready.get('reason')}")
            elif (
                self.new_image is not None
                and "podTemplateInputs" in status
                and status.get("adaptersReady", "1/1") == "1/1"
                and ready_images[name]
                and self.new_image not in ready_images[name]
            ):
                self.fleet.skew.add(name)
        self.fleet.samples += 1

    def run(self) -> None:
        while not self.stop.wait(1.0):
            try:
                self.sample()
            except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
                self.error.append(exc)
                return

    def __enter__(self) -> Sampler:
        self.sample()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        assert not self.error, self.error


def services(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    found = get_json(cluster, "-n", namespace, "inferenceservices")["items"]
    return {s["metadata"]["name"]: s for s in found}


def runtime_image(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])


def settled_on(cluster: Cluster, namespace: str, image: str) -> Callable[[], bool]:
    """Every service's Deployment runs `image`, its rollout over (the replaced pods gone, not only
    terminating), and the service is Ready and current."""

    def check() -> bool:
        deployments = {
            d["metadata"]["name"]: d for d in get_json(cluster, "-n", namespace, "deployments")["items"]
        }
        for name in SERVICES:
            d = deployments.get(name)
            if d is None or runtime_image(d) != image or rolling(d):
                return False
            if int((d.get("status") or {}).get("readyReplicas") or 0) != int(d["spec"].get("replicas", 1)):
                return False
        for pod in get_json(cluster, "-n", namespace, "pods", "-l", RUNTIME_PODS)["items"]:
            if pod["spec"]["containers"][0]["image"] != image:
                return False  # an old replica still draining
        for s in services(cluster, namespace).values():
            status = s.get("status") or {}
            if status.get("observedGeneration") != s["metadata"]["generation"]:
                return False
            if condition(s, "Ready").get("status") != "True" or status.get("adaptersReady", "1/1") != "1/1":
                return False
        return True

    return check


def roll(
    kube: Kube, namespace: str, helm_args: list[str], cluster: Cluster, image: str, upgrade: bool
) -> tuple[Fleet, float]:
    """`helm <helm_args> --wait`, then until every service runs `image` (settled_on), sampled every second;
    what the sampler saw and the seconds it took. `upgrade`: to this commit's operator (`Fleet.skew`)."""
    began = time.monotonic()
    with Sampler(kube, namespace, new_image=image if upgrade else None) as sampler:
        helm(cluster, *helm_args, "--wait", "--timeout=240s")
        wait_until(settled_on(cluster, namespace, image), f"every service on {image}", ROLL_TIMEOUT, 2)
    return sampler.fleet, time.monotonic() - began


@pytest.fixture
def earlier(stack: Stack) -> releases.Release:
    """The last release, built from its commit's worktree and pushed to the cluster's registry."""
    version = registry.released_versions()[-1]
    assert version != registry.chart_version(), "this checkout's chart must be past its last release"
    release = releases.publish(stack.cluster, version)
    print(f"\nRelease {version} ({release.commit[:12]}) built in {release.built_seconds:.0f} s")
    return release


@pytest.fixture
def old_operator(stack: Stack, earlier: releases.Release) -> Iterator[str]:
    """The earlier release's chart installed in a namespace of its own; uninstalled after the test."""
    cluster = stack.cluster
    namespace = f"pagoda-system-{uuid.uuid4().hex[:6]}"
    adopt_crd(cluster, OPERATOR_RELEASE, namespace)
    install_operator(
        cluster, OPERATOR_RELEASE, namespace, version=earlier.version, runtime_image=earlier.runtime_image
    )
    try:
        yield namespace
    finally:
        helm(cluster, "uninstall", OPERATOR_RELEASE, "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_an_upgrade_from_the_last_release_and_its_rollback_fail_no_request(
    stack: Stack, earlier: releases.Release, old_operator: str, namespace: str, cluster_api: Any
) -> None:
    cluster = stack.cluster
    kube = Kube(cluster_api)
    for name in SERVICES:
        apply(cluster, service(namespace, name))
    wait_until(
        settled_on(cluster, namespace, earlier.runtime_image), "three services Ready on the release", 600, 2
    )
    before = {
        name: (s["spec"], s["metadata"]["generation"]) for name, s in services(cluster, namespace).items()
    }

    gateway = start_gateway(cluster, ROUTED, namespace)
    loads = {
        SCALED: Load(service_url(cluster, namespace, SCALED), "tiny", clients=1, pause=0.5, max_seconds=1500),
        ADAPTED: Load(
            service_url(cluster, namespace, ADAPTED), "tiny", clients=1, pause=0.5, max_seconds=1500
        ),
        ADAPTER: Load(
            service_url(cluster, namespace, ADAPTED), ADAPTER, clients=1, pause=0.5, max_seconds=1500
        ),
        ROUTED: Load(gateway.url, "tiny", clients=1, pause=0.5, max_seconds=1500),
    }
    for load in loads.values():
        load.start()
    try:
        wait_until(
            lambda: all(load.completed >= 3 for load in loads.values()), "requests before the upgrade", 120
        )

        # 1. The upgrade: one rollout at a time, each granted by the budget.
        upgrade, seconds = roll(
            kube,
            namespace,
            [
                "upgrade",
                OPERATOR_RELEASE,
                cluster.urls["chart"],
                f"--version={registry.chart_version()}",
                "--plain-http",
                f"--namespace={old_operator}",
                f"--set=operator.runtimeImage={images.runtime_cpu_image()}",
            ],
            cluster,
            images.runtime_cpu_image(),
            upgrade=True,
        )
        upgraded = services(cluster, namespace)
        deployments = {
            d["metadata"]["name"]: d for d in get_json(cluster, "-n", namespace, "deployments")["items"]
        }
        print(f"\nUpgrade in {seconds:.0f} s: {upgrade}")
        assert upgrade.most_rolling == ROLLOUT_BUDGET, upgrade
        # The new operator managed the release's runtime pods while they waited their turn (version skew:
        # probes, metrics, the adapters' management calls): queued, Ready all along.
        assert len(upgrade.queued) >= len(SERVICES) - ROLLOUT_BUDGET, upgrade
        assert upgrade.not_ready == set(), upgrade
        assert upgrade.skew == set(SERVICES), upgrade
        for name in SERVICES:  # its one replica, replaced once, by a rollout the budget granted
            assert len(upgrade.pods[name]) == 2, (name, upgrade.pods)
            assert FLEET_ROLLOUT_ANNOTATION in deployments[name]["metadata"].get("annotations", {}), name
            assert upgraded[name]["status"].get("podTemplateInputs"), upgraded[name]["status"]
        assert {name: (s["spec"], s["metadata"]["generation"]) for name, s in upgraded.items()} == before
        assert not get_json(cluster, "-n", namespace, "jobs")["items"]

        # 2. The rollback: the release's operator rolls them back to its runtime image.
        rollback, seconds = roll(
            kube,
            namespace,
            ["rollback", OPERATOR_RELEASE, "1", f"--namespace={old_operator}"],
            cluster,
            earlier.runtime_image,
            upgrade=False,
        )
        print(f"Rollback in {seconds:.0f} s: {rollback}")
        for name in SERVICES:
            assert len(rollback.pods[name]) == 2, (name, rollback.pods)
        # The release's operator managed this commit's runtime pods until it replaced them: Ready all along.
        assert rollback.not_ready == set(), rollback
        rolled_back = services(cluster, namespace)
        assert {name: (s["spec"], s["metadata"]["generation"]) for name, s in rolled_back.items()} == before
        done = {name: load.completed for name, load in loads.items()}
        wait_until(
            lambda: all(load.completed >= done[name] + 3 for name, load in loads.items()),
            "requests after the rollback",
            120,
        )
    finally:
        for load in loads.values():
            load.stop()
        gateway.stop()
    restarted = {pod: count for pod, count in {**upgrade.restarts, **rollback.restarts}.items() if count}
    assert restarted == {}, restarted
    print("Requests: " + ", ".join(f"{name} {load.completed}" for name, load in loads.items()))
    for name, load in loads.items():
        assert load.failures == [], (name, load.failures[:10])
