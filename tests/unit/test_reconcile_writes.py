"""What one pass writes: the children that differ, one Event naming them, the status when it changed (the
first one once the Deployment controller has reported on the new Deployment).

A recording stand-in for the API client (no cluster in this tier); the integration tests check the same
against a real API server.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import kopf
import pytest
from fakekube import StampingWrites, owner_object

from pagoda.operator.handlers import NoDiffBase, configure
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.reconcile import apply, core, events

Obj = dict[str, Any]
SPEC = {"model": {"uri": "hf://pagoda-test/tiny-llama"}, "resources": {"gpu": {"count": 1}}, "replicas": 1}
NOW = "2026-12-01T00:00:00Z"
LATER = "2026-12-01T00:00:11Z"  # past the first status's grace


class RecordingKube(StampingWrites):
    """Answers writes the way the API server does (the object back, with a new resourceVersion)."""

    def __init__(self, fail_apply: str | None = None) -> None:
        super().__init__()
        self.events: list[Obj] = []
        self.fail_apply = fail_apply

    def apply(self, manifest: Obj, plural: str) -> Obj:
        if manifest["kind"] == self.fail_apply:
            raise OSError("connection reset")
        self.writes.append(("apply", manifest["kind"]))
        created = self._stamp({**manifest, "status": {}})
        created["metadata"]["creationTimestamp"] = NOW
        return created

    def create(self, manifest: Obj, plural: str) -> Obj:
        self.writes.append(("create", manifest["kind"]))
        self.events.append(manifest)
        return manifest

    def patch_status(
        self, api_version: str, kind: str, plural: str, namespace: str, name: str, status: Obj
    ) -> Obj:
        self.writes.append(("patch_status", kind))
        return self._stamp({**OWNER, "status": status})

    def delete(self, api_version: str, kind: str, plural: str, namespace: str, name: str, uid: str) -> None:
        self.writes.append(("delete", kind))

    def get_metadata(self, *_: Any) -> Obj | None:
        return None  # no Secret exists


OWNER = owner_object(SPEC)


def cache_with(owner: Obj) -> ObjectCache:
    cache = ObjectCache("InferenceService")
    cache.observe(owner)
    return cache


def run_pass(kube: RecordingKube, cache: ObjectCache, now: str = NOW) -> core.Outcome:
    return core.reconcile(kube, "ns", "llm", now=lambda: now, cache=cache)  # type: ignore[arg-type]


def controller_reports(cache: ObjectCache, **status: int) -> None:
    """The Deployment controller's status update, as its watch event would put it in the cache."""
    deployment = copy.deepcopy(cache.children("ns", "llm")[("Deployment", "llm")])
    deployment["metadata"]["resourceVersion"] = str(int(deployment["metadata"]["resourceVersion"]) + 100)
    deployment["status"] = {"observedGeneration": 1, **status}
    cache.observe(deployment)


def test_creation_writes_each_child_once_one_event_and_one_status_after_the_first_report() -> None:
    kube, cache = RecordingKube(), cache_with(OWNER)
    outcome = run_pass(kube, cache)
    # The NetworkPolicy before the pods; the Deployment, Service and PDB in one wave (any order); the Event.
    assert kube.writes[0] == ("apply", "NetworkPolicy") and kube.writes[-1] == ("create", "Event")
    assert sorted(kube.writes[1:-1]) == [
        ("apply", "Deployment"),
        ("apply", "PodDisruptionBudget"),
        ("apply", "Service"),
    ]
    assert outcome.result == "applied" and outcome.writes == 4  # the Event is not a write to a child
    assert outcome.requeue_after == 10.0  # the first status is written by then at the latest
    (event,) = kube.events
    assert (event["type"], event["reason"], event["message"]) == (
        "Normal",
        "Created",
        "Created NetworkPolicy llm, Deployment llm, Service llm, PodDisruptionBudget llm",
    )
    assert event["involvedObject"]["uid"] == "uid-owner"
    # The next pass (the watch events of those writes) sees its own writes in the cache: nothing to do yet.
    kube.writes.clear()
    assert run_pass(kube, cache).result == "unchanged"
    assert kube.writes == []
    # The Deployment controller's first report: the first status says what it reported.
    controller_reports(cache, replicas=1, updatedReplicas=1, unavailableReplicas=1)
    assert run_pass(kube, cache).requeue_after is None
    assert kube.writes == [("patch_status", "InferenceService")]
    status = (cache.owner("ns", "llm") or {})["status"]
    assert (status["replicas"], status["readySummary"]) == (1, "0/1")
    kube.writes.clear()
    assert run_pass(kube, cache).result == "unchanged"
    assert kube.writes == []


def test_first_status_is_written_after_the_grace_without_a_report() -> None:
    kube, cache = RecordingKube(), cache_with(OWNER)
    run_pass(kube, cache)
    kube.writes.clear()
    assert run_pass(kube, cache, now=LATER).requeue_after is None
    assert kube.writes == [("patch_status", "InferenceService")]
    status = (cache.owner("ns", "llm") or {})["status"]
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Ready"] == "ReplicasNotReady"


def test_a_problem_is_reported_at_once() -> None:
    owner = copy.deepcopy(OWNER)
    owner["spec"]["model"]["credentialsSecret"] = "hf-token"  # looked up: not found
    kube, cache = RecordingKube(), cache_with(owner)
    run_pass(kube, cache)
    assert ("patch_status", "InferenceService") in kube.writes
    status = (cache.owner("ns", "llm") or {})["status"]
    assert {c["type"]: c["reason"] for c in status["conditions"]}["Degraded"] == "SecretNotFound"


def test_a_pass_that_fails_half_way_still_names_what_it_changed() -> None:
    """The Service's write fails (the API server unreachable): the Deployment and the PDB, written in the
    same wave, landed and are named; the pass fails after that."""
    kube, cache = RecordingKube(fail_apply="Service"), cache_with(OWNER)
    with pytest.raises(OSError):
        run_pass(kube, cache)
    assert [e["message"] for e in kube.events] == [
        "Created NetworkPolicy llm, Deployment llm, PodDisruptionBudget llm"
    ]


def kinds(children: list[Obj]) -> list[str]:
    return [child["kind"] for child in children]


def test_waves_make_pods_last_and_scale_what_exists() -> None:
    """What a pod needs comes before the Deployment or Job that makes it, a ScaledObject after the
    Deployment it scales; the rest goes with the wave before it."""
    desired = [
        {"kind": kind}
        for kind in (
            "NetworkPolicy",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "ScaledObject",
            "ServiceAccount",
            "Role",
            "RoleBinding",
            "ConfigMap",
            "Deployment",
            "Service",
            "InferencePool",
            "HTTPRoute",
            "Job",
        )
    ]
    assert [kinds(wave) for wave in apply.waves(desired)] == [
        ["NetworkPolicy", "ConfigMap"],
        ["Deployment", "Service", "PodDisruptionBudget"],
        ["ScaledObject", "ServiceAccount", "Role", "RoleBinding", "ConfigMap"],
        ["Deployment", "Service", "InferencePool", "HTTPRoute"],
        ["Job"],
    ]
    assert [kinds(wave) for wave in apply.waves(desired[2:5])] == [
        ["Deployment", "Service", "PodDisruptionBudget"]
    ]
    assert apply.waves([]) == []


class MeetingKube(RecordingKube):
    """Holds each apply until `together` applies are in flight at once (or a timeout), and notes which
    kinds were in flight together."""

    def __init__(self, together: int) -> None:
        super().__init__()
        self.barrier = threading.Barrier(together, timeout=5)
        self.met: list[str] = []

    def apply(self, manifest: Obj, plural: str) -> Obj:
        if manifest["kind"] in ("Deployment", "Service", "PodDisruptionBudget"):
            self.barrier.wait()  # BrokenBarrierError after 5 s: they were not sent at once
            self.met.append(manifest["kind"])
        return super().apply(manifest, plural)


def test_the_writes_of_a_wave_are_in_flight_at_once() -> None:
    """A new service's Deployment, Service and PDB wait on the API server together, not one after another:
    each of the three applies returns only once all three have been sent."""
    kube = MeetingKube(together=3)
    outcome = run_pass(kube, cache_with(OWNER))
    assert sorted(kube.met) == ["Deployment", "PodDisruptionBudget", "Service"]
    assert outcome.result == "applied" and outcome.writes == 4 and outcome.problems == []


@pytest.mark.parametrize(
    ("changes", "reason", "message"),
    [
        ([("Updated", "Deployment", "drift")], "Updated", "Updated Deployment drift"),
        (
            [("Created", "Deployment", "a"), ("Created", "Service", "a")],
            "Created",
            "Created Deployment a, Service a",
        ),
        (
            [("Updated", "Deployment", "a"), ("Created", "ScaledObject", "a"), ("Deleted", "Service", "b")],
            "Changed",
            "Updated Deployment a; Created ScaledObject a; Deleted Service b",
        ),
    ],
)
def test_changes_event_names_every_child(
    changes: list[tuple[str, str, str]], reason: str, message: str
) -> None:
    assert events.changes_event(changes) == (reason, message)


def test_kopf_builds_no_diff_base() -> None:
    """Only on.event handlers: kopf's change detection would deep-copy every watched object for nothing."""
    settings = kopf.OperatorSettings()
    configure(settings, watch_timeout=60)
    assert isinstance(settings.persistence.diffbase_storage, NoDiffBase)
    body = kopf.Body({"metadata": {"name": "llm"}, "spec": SPEC})
    assert settings.persistence.diffbase_storage.build(body=body) is None
    assert settings.persistence.diffbase_storage.fetch(body=body) is None
