"""spec.lora on the real control plane (kwok pods): the limits are in the pod template, the adapters are not.

Adding an adapter changes no child (no new ReplicaSet, no restart): the operator loads it into each Ready pod
at run time. kwok's pods run nothing (the harness routes their IPs as unreachable), so every load attempt
fails at once and the status says so; e2e/test_lora.py loads adapters into real runtimes.
"""

from __future__ import annotations

from typing import Any

from harness import OperatorProcess, wait_until
from isvc import create_ready, get, patch
from kubernetes import client

from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.meta import OWNER_LABEL

LIMITS = {"maxLoras": 2, "maxLoraRank": 8, "maxCpuLoras": 4}


def test_adding_an_adapter_rolls_nothing_and_the_status_counts_it(
    operator: OperatorProcess, kube: client.CustomObjectsApi, raw: Kube, namespace: str
) -> None:
    obj = create_ready(kube, "lora", namespace, lora=LIMITS)
    assert obj["status"]["adaptersReady"] == "0/0" and obj["status"]["adapters"] == []
    before = raw.get("apps/v1", "deployments", namespace, "lora")
    assert before is not None
    args = before["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--max-loras") + 1] == "2" and args[args.index("--max-lora-rank") + 1] == "8"
    sets = raw.list("apps/v1", "replicasets", namespace, f"{OWNER_LABEL}=lora")
    assert len(sets) == 1

    adapter = {"name": "sql", "uri": "hf://pagoda-test/sql-lora"}
    patch(kube, "lora", namespace, {"lora": {**LIMITS, "adapters": [adapter]}})

    def reported() -> dict[str, Any] | None:
        found = get(kube, "lora", namespace)
        status = (found or {}).get("status") or {}
        entries = status.get("adapters") or []
        return (
            found
            if status.get("adaptersReady") == "0/1" and entries and entries[0]["replicas"] == 2
            else None
        )

    found = wait_until(reported, "status.adapters to count the new adapter on 2 Ready replicas")
    (entry,) = found["status"]["adapters"]
    assert entry["name"] == "sql" and entry["readyReplicas"] == 0 and entry["state"] == "Loading"
    assert entry["reason"] == "ReplicaUnreachable", entry  # kwok pod IPs: the call fails at once
    after = raw.get("apps/v1", "deployments", namespace, "lora")
    assert after is not None
    assert after["spec"]["template"] == before["spec"]["template"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]
    assert len(raw.list("apps/v1", "replicasets", namespace, f"{OWNER_LABEL}=lora")) == 1

    patch(kube, "lora", namespace, {"lora": {**LIMITS, "adapters": []}})
    wait_until(
        lambda: ((get(kube, "lora", namespace) or {}).get("status") or {}).get("adaptersReady") == "0/0",
        "the removed adapter to leave the status",
    )
    patch(kube, "lora", namespace, {"lora": None})
    wait_until(
        lambda: "adaptersReady" not in ((get(kube, "lora", namespace) or {}).get("status") or {}),
        "status.adapters to go with spec.lora",
    )
