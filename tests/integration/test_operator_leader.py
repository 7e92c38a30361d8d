"""Two operator replicas with leader election on a Lease (operator/reconcile/leader.py), on the real API
server: only the leader writes; killed (SIGKILL) in the middle of a spec change, the other takes over
within the lease duration and completes the change; stopped cleanly (SIGTERM), it hands the Lease over at
once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness import OperatorProcess, wait_until
from isvc import create_ready, get, patch, ready_and_current
from kubernetes import client

from e2e.cluster import Cluster
from pagoda.operator.reconcile.kube import Kube
from pagoda.operator.reconcile.leader import Timing

LEASE = ("default", "pagoda-operator-test-leader")
WRITES = "pagoda_operator_api_writes_total"


def leading(process: OperatorProcess) -> bool:
    return process.total("pagoda_operator_leader") == 1


def lease(raw: Kube) -> dict[str, Any]:
    found = raw.get("coordination.k8s.io/v1", "leases", *LEASE)
    assert found is not None
    spec: dict[str, Any] = found["spec"]
    return spec


def test_one_leader_writes_and_the_other_takes_over_when_it_dies_mid_change(
    cluster: Cluster,
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    operator.stop()  # the session's operator runs without leader election: it would write beside these two
    replicas = [
        OperatorProcess(cluster.kubeconfig, tmp_path / name, leader_elect="/".join(LEASE)) for name in "ab"
    ]
    for replica in replicas:
        replica.workdir.mkdir()
    first, second = replicas
    try:
        first.start()
        wait_until(lambda: leading(first), "the first replica to lead", timeout=30)
        second.start()
        create_ready(kube, "led", namespace, replicas=1)
        assert not leading(second) and second.total(WRITES) == 0, "the standby wrote"
        holder = lease(raw)["holderIdentity"]
        transitions = lease(raw)["leaseTransitions"]

        # A spec change, and the leader killed before it can finish (or right after it began).
        patch(kube, "led", namespace, {"replicas": 2})
        first.kill()
        killed = time.monotonic()
        wait_until(lambda: leading(second), "the standby to take the Lease", timeout=60, interval=0.5)
        takeover = time.monotonic() - killed
        timing = Timing()
        assert takeover < timing.lease_duration + 2 * timing.retry_period + 3, takeover
        after = lease(raw)
        assert after["holderIdentity"] != holder and after["leaseTransitions"] == transitions + 1

        def converged() -> dict[str, Any] | None:
            obj = get(kube, "led", namespace)
            deployment = raw.get("apps/v1", "deployments", namespace, "led") or {}
            done = ready_and_current(obj) and deployment.get("spec", {}).get("replicas") == 2
            return obj if done else None

        wait_until(converged, "the new leader to complete the change", timeout=60)
        assert second.total(WRITES) > 0

        # A clean stop releases the Lease: the standby takes it at its next try, not a lease duration later.
        first.start()
        time.sleep(1)
        assert not leading(first)
        second.stop()
        stopped = time.monotonic()
        wait_until(lambda: leading(first), "the restarted replica to take the released Lease", timeout=30)
        handover = time.monotonic() - stopped
        assert handover < 2 * timing.retry_period + 2, handover
        print(f"\ntakeover after SIGKILL {takeover:.1f} s, after SIGTERM {handover:.1f} s")
    finally:
        for replica in replicas:
            replica.stop()
        raw_lease = raw.get("coordination.k8s.io/v1", "leases", *LEASE)
        if raw_lease is not None:
            cluster.kubectl("delete", "lease", "-n", LEASE[0], LEASE[1], check=False)
        operator.start()
