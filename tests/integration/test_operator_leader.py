"""Two operator replicas with leader election on a Lease (operator/kube/leader.py), on the real API
server: only the leader writes; killed (SIGKILL) in the middle of a spec change, the other takes over
within the lease duration and completes the change; stopped cleanly (SIGTERM), it hands the Lease over at
once. The fence: a leader whose renewals stopped (its event loop stalled, its process paused) writes
nothing once a standby may have taken over."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from harness import OperatorProcess, wait_until
from isvc import create_ready, get, patch, ready_and_current
from kubernetes import client

from e2e.lab.cluster import Cluster
from pagoda.operator.kube.client import Kube, NotLeader
from pagoda.operator.kube.leader import LeaderElector, Timing
from pagoda.operator.reconcile.core import reconcile

LEASE = ("default", "pagoda-operator-test-leader")
WRITES = "pagoda_operator_api_writes_total"


def leading(process: OperatorProcess) -> bool:
    return process.total("pagoda_operator_leader") == 1


def lease(raw: Kube) -> dict[str, Any]:
    found = raw.get("coordination.k8s.io/v1", "leases", *LEASE)
    assert found is not None
    spec: dict[str, Any] = found["spec"]
    return spec


@contextmanager
def two_replicas(
    cluster: Cluster, operator: OperatorProcess, tmp_path: Path
) -> Iterator[list[OperatorProcess]]:
    """Two operator replicas electing a leader on LEASE, in place of the session's operator (which runs
    without leader election: it would write beside them); afterwards both stopped (a paused one resumed
    first), the Lease deleted and the session's operator back."""
    operator.stop()
    replicas = [
        OperatorProcess(cluster.kubeconfig, tmp_path / name, leader_elect="/".join(LEASE)) for name in "ab"
    ]
    for replica in replicas:
        replica.workdir.mkdir()
    try:
        yield replicas
    finally:
        for replica in replicas:
            if replica.proc is not None and replica.proc.poll() is None:
                os.kill(replica.proc.pid, signal.SIGCONT)
            replica.stop()
        cluster.kubectl("delete", "lease", "-n", LEASE[0], LEASE[1], check=False)
        operator.start()


def test_one_leader_writes_and_the_other_takes_over_when_it_dies_mid_change(
    cluster: Cluster,
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    with two_replicas(cluster, operator, tmp_path) as (first, second):
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


def children_versions(raw: Kube, namespace: str, name: str) -> dict[str, str]:
    """The resourceVersions of the InferenceService, its Deployment and its Service: a write changes one."""
    found = {
        "InferenceService": raw.get("pagoda.dev/v1alpha1", "inferenceservices", namespace, name),
        "Deployment": raw.get("apps/v1", "deployments", namespace, name),
        "Service": raw.get("v1", "services", namespace, name),
    }
    return {kind: obj["metadata"]["resourceVersion"] for kind, obj in found.items() if obj is not None}


def test_a_leader_whose_renewals_stalled_writes_nothing_after_a_standby_takes_over(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    """The failure the fence is for: the event loop that renews the Lease (and would end the process)
    stalls while a reconcile thread goes on. Here the leader's loop is the test, which stops renewing; its
    reconcile pass runs the operator's own code on the real API server after the standby took over."""
    create_ready(kube, "fenced", namespace, replicas=1)
    operator.stop()  # runs without leader election: it would apply the change below itself
    lease = ("default", "pagoda-operator-test-fence")
    timing = Timing(lease_duration=4.0, renew_deadline=3.0, retry_period=1.0)
    old = LeaderElector(Kube(raw.api), *lease, "old_1", timing)
    new = LeaderElector(Kube(raw.api), *lease, "new_1", timing)
    try:
        assert old.try_acquire_or_renew() and not new.try_acquire_or_renew()
        fenced = Kube(raw.api, fence=old.holds_lease)
        patch(kube, "fenced", namespace, {"replicas": 2})
        # The old leader renews no more (its loop stalled); the standby takes over a lease duration later.
        wait_until(
            new.try_acquire_or_renew,
            "the standby to take the Lease",
            timeout=30,
            interval=timing.retry_period,
        )
        before = children_versions(raw, namespace, "fenced")
        with pytest.raises(NotLeader):
            reconcile(fenced, namespace, "fenced")  # the old leader's next pass
        with pytest.raises(NotLeader):
            fenced.apply(raw.get("apps/v1", "deployments", namespace, "fenced") or {}, "deployments")
        assert children_versions(raw, namespace, "fenced") == before, "the old leader wrote"
        deployment = raw.get("apps/v1", "deployments", namespace, "fenced") or {}
        assert deployment["spec"]["replicas"] == 1

        # The new leader's pass, through the same code, completes the change.
        reconcile(Kube(raw.api, fence=new.holds_lease), namespace, "fenced")
        deployment = raw.get("apps/v1", "deployments", namespace, "fenced") or {}
        assert deployment["spec"]["replicas"] == 2
    finally:
        new.release()
        raw.delete(
            "coordination.k8s.io/v1",
            "Lease",
            "leases",
            *lease,
            (raw.get("coordination.k8s.io/v1", "leases", *lease) or {"metadata": {"uid": ""}})["metadata"][
                "uid"
            ],
        )
        operator.start()


def test_a_paused_leader_resumes_writing_nothing_and_exits(
    cluster: Cluster,
    operator: OperatorProcess,
    kube: client.CustomObjectsApi,
    raw: Kube,
    namespace: str,
    tmp_path: Path,
) -> None:
    """The whole leader process paused (SIGSTOP: a frozen node or VM, a debugger) past the lease duration:
    the standby takes over and completes a spec change; resumed (SIGCONT), the old leader writes nothing
    (its threads resume with it, and the fence stops any pass or write they were in) and exits."""
    with two_replicas(cluster, operator, tmp_path) as (first, second):
        first.start()
        wait_until(lambda: leading(first), "the first replica to lead", timeout=30)
        second.start()
        create_ready(kube, "paused", namespace, replicas=1)
        assert first.proc is not None
        os.kill(first.proc.pid, signal.SIGSTOP)
        wait_until(lambda: leading(second), "the standby to take the Lease", timeout=60, interval=0.5)
        patch(kube, "paused", namespace, {"replicas": 2})

        def converged() -> bool:
            deployment = raw.get("apps/v1", "deployments", namespace, "paused") or {}
            obj = get(kube, "paused", namespace)
            return bool(obj and ready_and_current(obj) and deployment.get("spec", {}).get("replicas") == 2)

        wait_until(converged, "the new leader to complete the change", timeout=60)
        time.sleep(1)  # the new leader's last writes of the change have landed
        before = children_versions(raw, namespace, "paused")
        os.kill(first.proc.pid, signal.SIGCONT)
        wait_until(
            lambda: first.proc is not None and first.proc.poll() is not None,
            "the old leader to exit",
            timeout=15,
        )
        time.sleep(1)
        assert children_versions(raw, namespace, "paused") == before, "the old leader wrote after resuming"
        assert "Lost lease" in first.log()
