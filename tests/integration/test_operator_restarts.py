"""Scheduled restarts on the real control plane: a schedule added to a running service rolls its Deployment
one interval later (a new ReplicaSet, the template's pagoda.dev/restartedAt), the status shows the last and
the next restart, and removing the schedule rolls nothing more."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from harness import OperatorProcess, wait_until
from isvc import create_ready, get, patch, ready_and_current
from kubernetes import client

from pagoda.operator.kube.client import Kube
from pagoda.operator.resources.meta import (
    OWNER_LABEL,
    RESTART_SCHEDULE_SINCE_ANNOTATION,
    RESTARTED_AT_ANNOTATION,
)

EVERY = timedelta(minutes=1)  # the shortest schedule the API allows


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def template_stamp(deployment: dict[str, Any]) -> str | None:
    annotations = deployment["spec"]["template"]["metadata"].get("annotations") or {}
    stamp: str | None = annotations.get(RESTARTED_AT_ANNOTATION)
    return stamp


def test_a_schedule_rolls_the_deployment_and_reports_last_and_next(
    operator: OperatorProcess, kube: client.CustomObjectsApi, cluster_api: Any, raw: Kube, namespace: str
) -> None:
    create_ready(kube, "sched", namespace, replicas=2)

    def deployment() -> dict[str, Any]:
        found = raw.get("apps/v1", "deployments", namespace, "sched")
        assert found is not None
        return found

    def replica_sets() -> list[dict[str, Any]]:
        return raw.list("apps/v1", "replicasets", namespace, f"{OWNER_LABEL}=sched")

    assert len(replica_sets()) == 1
    patch(kube, "sched", namespace, {"restartSchedule": {"every": "1m"}})

    # Adding the schedule restarts nothing: the operator notes when it saw it; the first restart is due
    # one interval later, and the status says so.
    def planned() -> dict[str, Any] | None:
        restarts = ((get(kube, "sched", namespace) or {}).get("status") or {}).get("restarts")
        return dict(restarts) if restarts else None

    first = wait_until(planned, "status.restarts after the schedule was added")
    since = deployment()["metadata"]["annotations"][RESTART_SCHEDULE_SINCE_ANNOTATION]
    assert first == {"next": (parse(since) + EVERY).strftime("%Y-%m-%dT%H:%M:%SZ")}, (first, since)
    assert template_stamp(deployment()) is None

    # One interval later: the pod template carries the restart time, and the Deployment rolls.
    stamp = wait_until(lambda: template_stamp(deployment()), "the scheduled restart", timeout=150, interval=1)
    assert parse(stamp) >= parse(first["next"])
    sets = wait_until(lambda: (found := replica_sets()) and len(found) == 2 and found, "a second ReplicaSet")
    assert len({rs["metadata"]["labels"]["pod-template-hash"] for rs in sets}) == 2

    def restarted() -> dict[str, Any] | None:
        obj = get(kube, "sched", namespace)
        last = ((obj or {}).get("status") or {}).get("restarts", {}).get("last")
        return obj if obj and ready_and_current(obj) and last == stamp else None

    obj = wait_until(restarted, "Ready after the restart, with status.restarts.last", timeout=120)
    assert parse(obj["status"]["restarts"]["next"]) == parse(stamp) + EVERY
    events = client.CoreV1Api(cluster_api).list_namespaced_event(namespace).items
    assert [e for e in events if e.involved_object.name == "sched" and e.reason == "ScheduledRestart"]

    # Removing the schedule drops status.restarts and the schedule's own annotation, and keeps the last
    # restart on the template: dropping it would roll the pods once more.
    before = deployment()
    patch(kube, "sched", namespace, {"restartSchedule": None})
    wait_until(
        lambda: (
            "restarts" not in ((get(kube, "sched", namespace) or {}).get("status") or {})
            and RESTART_SCHEDULE_SINCE_ANNOTATION not in (deployment()["metadata"].get("annotations") or {})
        ),
        "status.restarts and the schedule's annotation to be gone",
    )
    after = deployment()
    assert template_stamp(after) == template_stamp(before) == stamp
    assert after["spec"]["template"] == before["spec"]["template"]
    assert len(replica_sets()) == len(sets)  # no further rollout
