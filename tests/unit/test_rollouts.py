"""What an operator upgrade restarts. The fleet's rollout budget (operator/reconcile/rollouts.py): a change of
the operator's own pod template
(an upgrade's new defaults, here its runtime image) leaves a running service's Deployment as it is while the
budget is taken, and rolls it once a slot frees; the service's own changes roll at once; Deployments from an
operator before the annotation count as unchanged when their spec was applied; and many services rolling
through passes in any order never hold more than the budget at once. Profile Jobs
(reconcile/profile.py keep_measured_job): a Job that measured the same inputs is kept, an earlier operator's
included, so an upgrade starts no profile; and the fleet's budget of profile Jobs (ProfileBudget) holds a new
one, Queued, while others run, never more than its limit at once."""

from __future__ import annotations

import copy
import random
from typing import Any

import pytest
from prometheus_client import REGISTRY

from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import KubeError
from pagoda.operator.reconcile import core
from pagoda.operator.reconcile.desired import child_inputs, desired_state
from pagoda.operator.reconcile.profile import ProfileBudget, keep_measured_job
from pagoda.operator.reconcile.rollouts import (
    FLEET_ROLLOUT_ANNOTATION,
    Change,
    FleetRollouts,
    budget_template,
    classify,
    fleet_rolling,
    inputs_hash,
    rolling,
    rollout_message,
)
from pagoda.operator.resources import ChildInputs, OperatorSettings, RestartStamps
from pagoda.operator.resources.profile import PROFILE_INPUTS_ANNOTATION

Obj = dict[str, Any]
NOW = "2026-12-06T12:00:00Z"
OLD = OperatorSettings(default_image="registry.local/pagoda-runtime:0.1.0")
NEW = OperatorSettings(default_image="registry.local/pagoda-runtime:0.2.0")
SPEC: Obj = {
    "model": {"uri": "hf://pagoda-test/tiny-llama"},
    "resources": {"gpu": {"count": 1}},
    "replicas": 2,
}


def owner(
    name: str = "llm",
    spec: Obj | None = None,
    generation: int = 1,
    applied: int | None = 1,
    hashed: bool = True,
) -> Obj:
    """The InferenceService `name` in `ns`; `applied`: its status.observedGeneration (None: no status);
    `hashed`: the status has the podTemplateInputs of that spec (an operator before it wrote none)."""
    obj: Obj = {
        "apiVersion": "pagoda.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "resourceVersion": "1",
            "generation": generation,
        },
        "spec": copy.deepcopy(spec or SPEC),
    }
    if applied is not None:
        obj["status"] = {"observedGeneration": applied}
        if hashed:
            obj["status"]["podTemplateInputs"] = own_inputs(obj)
    return obj


def own_inputs(service: Obj) -> str:
    """The service's inputs hash, as a pass of it without a restart schedule or chat template computes it."""
    return inputs_hash(service["spec"], child_inputs(service, OLD, None, None))


def deployment(service: Obj, settings: OperatorSettings, done: bool = True, version: int = 10) -> Obj:
    """`service`'s Deployment as `settings`' operator applied it; `done`: its rollout over."""
    [manifest] = [
        m
        for m in desired_state(service, InferenceServiceSpec.model_validate(service["spec"]), settings)
        if m["kind"] == "Deployment" and m["metadata"]["name"] == service["metadata"]["name"]
    ]
    replicas = manifest["spec"].get("replicas", 1)
    meta = {**manifest["metadata"], "uid": "d-" + service["metadata"]["name"], "generation": 3}
    meta["resourceVersion"] = str(version)
    status = {"observedGeneration": 3, "replicas": replicas, "updatedReplicas": replicas}
    if not done:
        status = {"observedGeneration": 3, "replicas": replicas + 1, "updatedReplicas": 1}
    return {**manifest, "metadata": meta, "status": status}


def image(d: Obj) -> str:
    return str(d["spec"]["template"]["spec"]["containers"][0]["image"])


class Kube:
    """Answers applies and status patches as the API server does (the object back), and records them."""

    def __init__(self, owners: dict[str, Obj]) -> None:
        self.owners = owners
        self.applied: list[Obj] = []

    def check_leader(self, what: str) -> None:
        """No leader election here (kube.py's fence)."""

    def apply(self, manifest: Obj, plural: str) -> Obj:
        self.applied.append(manifest)
        answered = copy.deepcopy(manifest)
        answered["metadata"]["resourceVersion"] = str(100 + len(self.applied))
        return answered

    def create(self, manifest: Obj, plural: str) -> Obj:
        return manifest

    def patch_status(self, api_version: str, kind: str, plural: str, ns: str, name: str, status: Obj) -> Obj:
        return {**self.owners[name], "status": status}

    def delete(self, *args: Any) -> None:
        raise AssertionError("nothing to delete")

    def deployments(self) -> list[Obj]:
        return [m for m in self.applied if m["kind"] == "Deployment"]


def run_pass(
    kube: Kube,
    cache: ObjectCache,
    name: str,
    settings: OperatorSettings,
    budget: FleetRollouts | None = None,
    profiles: ProfileBudget | None = None,
) -> Any:
    return core.reconcile(
        kube,  # type: ignore[arg-type]
        "ns",
        name,
        now=lambda: NOW,
        cache=cache,
        settings=settings,
        rollouts=budget,
        profiles=profiles,
    )


def conditions(cache: ObjectCache, name: str) -> dict[str, Obj]:
    status = (cache.owner("ns", name) or {}).get("status") or {}
    return {c["type"]: c for c in status.get("conditions", [])}


# --- what changed ----------------------------------------------------------------------------------------


def test_the_inputs_hash_is_the_services_own_and_ignores_the_operators_settings() -> None:
    base = ChildInputs(settings=OLD)
    assert inputs_hash(SPEC, base) == inputs_hash(copy.deepcopy(SPEC), ChildInputs(settings=NEW))
    assert inputs_hash(SPEC, base) != inputs_hash({**SPEC, "replicas": 3}, base)
    restarted = ChildInputs(settings=OLD, stamps=RestartStamps(restarted_at=NOW))
    assert inputs_hash(SPEC, base) != inputs_hash(SPEC, restarted)
    assert inputs_hash(SPEC, base) != inputs_hash(SPEC, ChildInputs(settings=OLD, slo_concurrency=4))


def test_classify_tells_the_operators_change_from_the_services() -> None:
    service = owner()
    live = deployment(service, OLD)

    def want(obj: Obj, settings: OperatorSettings) -> Obj:
        spec = InferenceServiceSpec.model_validate(obj["spec"])
        [d] = [m for m in desired_state(obj, spec, settings) if m["kind"] == "Deployment"]
        return d

    same = own_inputs(service)
    assert classify(want(service, OLD), None, service, same) is Change.NONE  # nothing runs yet
    assert classify(want(service, OLD), live, service, same) is Change.NONE
    assert image(want(service, NEW)) != image(live)
    assert classify(want(service, NEW), live, service, same) is Change.FLEET
    # The spec changed since the last pass (its hash in the status is the old spec's).
    changed = {**service, "spec": {**SPEC, "engine": {"maxModelLen": 512}}}
    assert classify(want(changed, NEW), live, changed, own_inputs(changed)) is Change.OWN
    # A status of an operator before the hash: unchanged if it saw this generation, the service's own
    # change if not.
    legacy = owner(hashed=False)
    assert classify(want(legacy, NEW), live, legacy, same) is Change.FLEET
    edited = owner(generation=2, applied=1, hashed=False)
    assert classify(want(edited, NEW), live, edited, same) is Change.OWN


def test_rolling_reads_the_deployment_controllers_progress() -> None:
    service = owner()
    assert not rolling(deployment(service, OLD))
    assert rolling(deployment(service, OLD, done=False))
    behind = deployment(service, OLD)
    behind["metadata"]["generation"] = 4  # written, not yet seen by the controller
    assert rolling(behind)
    stuck = deployment(service, OLD, done=False)
    stuck["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    assert not rolling(stuck)  # holds no slot; its service's status says it is stuck
    marked = deployment(service, OLD, done=False)
    marked["metadata"].setdefault("annotations", {})[FLEET_ROLLOUT_ANNOTATION] = NOW
    assert fleet_rolling(
        [(("ns", "llm"), marked), (("ns", "b"), deployment(owner("b"), OLD, done=False))]
    ) == {("ns", "llm")}


# --- the budget ------------------------------------------------------------------------------------------


def test_the_budget_grants_in_the_order_asked_and_never_beyond_its_limit() -> None:
    clock = iter(range(1000))
    budget = FleetRollouts(2, clock=lambda: float(next(clock)))
    a, b, c, d = (("ns", x) for x in "abcd")
    busy = {("other", "x")}
    assert budget.ask(a, busy).granted
    turn_b = budget.ask(b, busy)
    assert (turn_b.granted, turn_b.position, turn_b.busy, turn_b.limit) == (False, 1, 2, 2)
    turn_c = budget.ask(c, busy)
    assert (turn_c.position, turn_c.queued) == (2, 2)
    assert "2 of 2 in the queue" in rollout_message(turn_c) and "rollouts.maxConcurrent" in rollout_message(
        turn_c
    )
    # x finished: the first in line gets the slot, not whoever asks first.
    assert not budget.ask(c, {("ns", "a")}).granted
    assert budget.ask(b, {("ns", "a")}).granted
    assert not budget.ask(d, {("ns", "a"), ("ns", "b")}).granted
    assert budget.queued() == [c, d]
    assert REGISTRY.get_sample_value("pagoda_operator_rollouts_queued") == 2  # the operator's /metrics
    with pytest.raises(ValueError, match="rollouts.maxConcurrent"):
        FleetRollouts(0)


def test_a_service_that_stops_asking_leaves_the_queue() -> None:
    """A queued service that is deleted never asks again: after STALE_S it holds up no one behind it."""
    clock = [0.0]
    budget = FleetRollouts(1, clock=lambda: clock[0])
    busy = {("ns", "x")}
    first, second = ("ns", "deleted"), ("ns", "waiting")
    assert not budget.ask(first, busy).granted
    assert budget.ask(second, busy).position == 2
    clock[0] = 30.0
    assert not budget.ask(second, set()).granted  # x done; `deleted` is first in line, asked 30 s ago
    clock[0] = 61.0
    assert budget.ask(second, set()).granted
    assert budget.queued() == []


# --- passes ----------------------------------------------------------------------------------------------


def test_an_operator_upgrade_leaves_a_running_deployment_alone_until_its_turn() -> None:
    service, other = owner("llm"), owner("other")
    cache = ObjectCache("InferenceService")
    for obj in (service, other):
        cache.observe(obj)
    live = deployment(service, OLD)
    busy = deployment(other, OLD, done=False)  # the budget's one slot: `other` rolls for the upgrade
    busy["metadata"].setdefault("annotations", {})[FLEET_ROLLOUT_ANNOTATION] = NOW
    cache.observe(live)
    cache.observe(busy)
    kube = Kube({"llm": service, "other": other})
    budget = FleetRollouts(1)

    outcome = run_pass(kube, cache, "llm", NEW, budget)
    assert kube.deployments() == []  # nothing written to the Deployment: no pod restarts
    queued = conditions(cache, "llm")["RolloutQueued"]
    assert (queued["status"], queued["reason"]) == ("True", "WaitingForRolloutSlot")
    assert "1 of 1 in the queue" in queued["message"], queued
    assert outcome.requeue_after is not None and outcome.requeue_after <= 5

    # `other`'s rollout is over: the next pass rolls this one, marked as the fleet's.
    cache.observe(
        deployment(other, NEW, version=20)
        | {
            "metadata": {**busy["metadata"], "resourceVersion": "20"},
            "status": {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2},
        }
    )
    run_pass(kube, cache, "llm", NEW, budget)
    [rolled] = kube.deployments()
    assert image(rolled) == NEW.default_image
    assert rolled["metadata"]["annotations"][FLEET_ROLLOUT_ANNOTATION] == NOW
    assert "RolloutQueued" not in conditions(cache, "llm")


def test_a_services_own_change_rolls_at_once_whatever_the_budget() -> None:
    edited = {**owner("llm"), "spec": {**SPEC, "engine": {"maxModelLen": 512}}}  # status: the old spec's
    edited["metadata"] = {**edited["metadata"], "generation": 2}
    other = owner("other")
    cache = ObjectCache("InferenceService")
    for obj in (edited, other):
        cache.observe(obj)
    cache.observe(deployment(owner("llm"), OLD))
    busy = deployment(other, OLD, done=False)
    busy["metadata"].setdefault("annotations", {})[FLEET_ROLLOUT_ANNOTATION] = NOW
    cache.observe(busy)
    kube = Kube({"llm": edited, "other": other})
    run_pass(kube, cache, "llm", NEW, FleetRollouts(1))
    [rolled] = kube.deployments()
    assert image(rolled) == NEW.default_image  # the new defaults come with the user's own change
    assert FLEET_ROLLOUT_ANNOTATION not in rolled["metadata"].get("annotations", {})


@pytest.mark.parametrize("limit", [1, 2])
def test_a_fleet_upgraded_in_passes_of_any_order_never_rolls_more_than_the_budget(limit: int) -> None:
    """Eight services on the old operator; the new one's passes run in a random order each round (a
    round: one second of the operator's work queue), and a rollout takes 3 rounds of the Deployment
    controller. Sampled at every round: never more than `limit` roll; in the end every one runs the new
    image, and none rolled twice."""
    rng = random.Random(7)
    names = [f"s{i}" for i in range(8)]
    owners = {n: owner(n) for n in names}
    cache = ObjectCache("InferenceService")
    for n in names:
        cache.observe(owners[n])
        cache.observe(deployment(owners[n], OLD))
    kube = Kube(owners)
    budget = FleetRollouts(limit)
    started: dict[str, int] = {}
    most = 0
    for round_ in range(60):
        for n in rng.sample(names, len(names)):
            before = len(kube.deployments())
            run_pass(kube, cache, n, NEW, budget)
            if len(kube.deployments()) > before:
                assert n not in started, f"{n} rolled twice"
                started[n] = round_
                written = kube.deployments()[-1]
                cache.observe(
                    written
                    | {
                        "metadata": {
                            **written["metadata"],
                            "uid": "d-" + n,
                            "resourceVersion": str(1000 + round_ * 10 + len(started)),
                        },
                        "status": {"observedGeneration": 0, "replicas": 3, "updatedReplicas": 1},
                    }
                )
        # The Deployment controller: a rollout is over 3 rounds after it started.
        for n, at in started.items():
            if round_ - at == 3:
                d = cache.children("ns", n)[("Deployment", n)]
                cache.observe(
                    d
                    | {
                        "metadata": {
                            **d["metadata"],
                            "resourceVersion": str(5000 + round_ * 10 + names.index(n)),
                        },
                        "status": {
                            "observedGeneration": d["metadata"].get("generation", 0),
                            "replicas": 2,
                            "updatedReplicas": 2,
                        },
                    }
                )
        now_rolling = {key for key, d in cache.all_of_kind("Deployment") if rolling(d)}
        most = max(most, len(now_rolling))
        assert len(now_rolling) <= limit, (round_, now_rolling)
    assert sorted(started) == names
    assert all(image(cache.children("ns", n)[("Deployment", n)]) == NEW.default_image for n in names)
    assert most == limit  # the budget was used, not only respected


def test_without_a_budget_a_pass_applies_the_operators_change_at_once() -> None:
    service = owner()
    live = deployment(service, OLD)
    [want] = [
        m
        for m in desired_state(service, InferenceServiceSpec.model_validate(SPEC), NEW)
        if m["kind"] == "Deployment"
    ]
    assert budget_template([want], live, service, own_inputs(service), None, list, NOW) is None
    assert image(want) == NEW.default_image


# --- profile Jobs through an upgrade ---------------------------------------------------------------------

SLO_SPEC: Obj = {
    **SPEC,
    "slo": {"ttftMs": 500, "interTokenMs": 50, "request": {"promptTokens": 64, "outputTokens": 16}},
}


def wanted_job(service: Obj) -> tuple[list[Obj], Obj]:
    desired = desired_state(service, InferenceServiceSpec.model_validate(service["spec"]), OLD)
    [job] = [m for m in desired if m["kind"] == "Job"]
    return desired, job


def running(job: Obj, name: str | None = None, digest: str | None = None) -> Obj:
    """`job` as the API server holds it: named `name`, annotated with `digest` (None: no annotation, as an
    operator before the annotation made it), its spec defaulted by the server."""
    meta = {**job["metadata"], "name": name or job["metadata"]["name"], "uid": "job-uid"}
    meta.pop("annotations", None)
    if digest is not None:
        meta["annotations"] = {PROFILE_INPUTS_ANNOTATION: digest}
    spec = {**job["spec"], "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid"}}}
    return {**job, "metadata": meta, "spec": spec, "status": {"succeeded": 1}}


def test_a_job_of_the_same_inputs_under_another_name_is_kept() -> None:
    service = owner(spec=SLO_SPEC)
    desired, job = wanted_job(service)
    digest = job["metadata"]["annotations"][PROFILE_INPUTS_ANNOTATION]
    old = running(job, name="llm-profile-0123456789", digest=digest)
    keep_measured_job(desired, {("Job", "llm-profile-0123456789"): old}, service)
    [kept] = [m for m in desired if m["kind"] == "Job"]
    assert kept["metadata"]["name"] == "llm-profile-0123456789" and kept["spec"] == old["spec"]
    assert kept["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]


def test_a_job_of_an_operator_before_digests_is_kept_while_its_spec_stands() -> None:
    """0.1.0's Job (no annotation; its name digested its whole template) is kept, and gets the annotation,
    while the status is 0.1.0's for this generation; after a spec change a new Job measures the new spec."""
    service = owner(spec=SLO_SPEC, hashed=False)
    desired, job = wanted_job(service)
    old = running(job, name="llm-profile-f00dfeed00")
    keep_measured_job(desired, {("Job", "llm-profile-f00dfeed00"): old}, service)
    [kept] = [m for m in desired if m["kind"] == "Job"]
    assert kept["metadata"]["name"] == "llm-profile-f00dfeed00"
    assert kept["metadata"]["annotations"] == job["metadata"]["annotations"]
    edited = owner(spec=SLO_SPEC, generation=2, applied=1, hashed=False)
    desired, job = wanted_job(edited)
    keep_measured_job(desired, {("Job", "llm-profile-f00dfeed00"): old}, edited)
    assert [m for m in desired if m["kind"] == "Job"] == [job]


def test_a_job_that_measured_other_inputs_is_replaced() -> None:
    service = owner(spec=SLO_SPEC)  # the status has this operator's hash: no 0.1.0 Job to keep
    desired, job = wanted_job(service)
    old = running(job, name="llm-profile-0123456789", digest="0123456789")
    keep_measured_job(desired, {("Job", "llm-profile-0123456789"): old}, service)
    assert [m for m in desired if m["kind"] == "Job"] == [job]
    unmarked = running(job, name="llm-profile-f00dfeed00")
    keep_measured_job(desired, {("Job", "llm-profile-f00dfeed00"): unmarked}, service)
    assert [m for m in desired if m["kind"] == "Job"] == [job]


# --- the fleet's budget of profile Jobs ------------------------------------------------------------------


class JobKube(Kube):
    """Kube, with the lists the pass makes of a finished profile Job's pods (none here: no result)."""

    def list(self, api_version: str, plural: str, namespace: str, selector: str) -> list[Obj]:
        return []


def created_jobs(kube: Kube) -> list[Obj]:
    return [m for m in kube.applied if m["kind"] == "Job"]


def seen(cache: ObjectCache, job: Obj, version: int, ended: bool = False) -> None:
    """The cache's watch sees `job` as the API server holds it: running, or `ended` (Complete)."""
    status: Obj = {"active": 1}
    if ended:
        status = {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}
    meta = {**job["metadata"], "uid": "job-" + job["metadata"]["name"], "resourceVersion": str(version)}
    cache.observe({**job, "metadata": meta, "status": status})


def test_a_new_profile_waits_queued_while_the_budget_is_taken_and_keeps_what_was_measured() -> None:
    measured = {"job": "llm-profile-0000000000", "state": "Succeeded", "concurrency": 3, "measuredBy": "x"}
    service = owner("llm", spec=SLO_SPEC)
    service["status"]["profile"] = measured
    other = owner("other", spec=SLO_SPEC)
    cache = ObjectCache("InferenceService")
    for obj in (service, other):
        cache.observe(obj)
    _, others_job = wanted_job(other)
    seen(cache, others_job, 10)  # `other`'s profile runs: the budget's one slot
    kube = JobKube({"llm": service, "other": other})
    budget = ProfileBudget(1)

    outcome = run_pass(kube, cache, "llm", OLD, profiles=budget)
    assert created_jobs(kube) == []
    profile = (cache.owner("ns", "llm") or {})["status"]["profile"]
    assert profile["state"] == "Queued" and profile["job"].startswith("llm-profile-"), profile
    assert "1 of 1 in the queue; 1 of 1 profile Jobs running" in profile["message"], profile
    assert profile["concurrency"] == 3  # metric SLO scales on the last profile meanwhile
    assert outcome.requeue_after is not None and outcome.requeue_after <= 5
    assert REGISTRY.get_sample_value("pagoda_operator_profiles_queued") == 1

    seen(cache, others_job, 11, ended=True)  # its profile ended: the slot is free
    run_pass(kube, cache, "llm", OLD, profiles=budget)
    [job] = created_jobs(kube)
    assert job["metadata"]["name"] == profile["job"]
    with pytest.raises(ValueError, match="profiles.maxConcurrent"):
        ProfileBudget(0)


@pytest.mark.parametrize("limit", [1, 2])
def test_new_services_profiles_in_passes_of_any_order_never_run_more_than_the_budget(limit: int) -> None:
    """Six new services with spec.slo, their passes in a random order each round; a profile Job runs 3
    rounds. Sampled at every round: never more than `limit` profile Jobs run; in the end each service's
    profile ran once."""
    rng = random.Random(11)
    names = [f"p{i}" for i in range(6)]
    owners = {n: owner(n, spec=SLO_SPEC, applied=None) for n in names}
    cache = ObjectCache("InferenceService")
    for n in names:
        cache.observe(owners[n])
    kube = JobKube(owners)
    budget = ProfileBudget(limit)
    started: dict[str, tuple[int, Obj]] = {}
    most = 0
    for round_ in range(40):
        for n in rng.sample(names, len(names)):
            run_pass(kube, cache, n, OLD, profiles=budget)
            for job in created_jobs(kube):
                owner_name = job["metadata"]["name"].split("-profile-")[0]
                if owner_name not in started:
                    started[owner_name] = (round_, job)
                    seen(cache, job, 10_000 + round_ * 10 + len(started))
                else:
                    assert started[owner_name][1]["metadata"]["name"] == job["metadata"]["name"]
        for n, (at, job) in started.items():  # the Job controller: a profile ends 3 rounds after it began
            if round_ - at == 3:
                seen(cache, job, 50_000 + round_ * 10 + names.index(n), ended=True)
        running_now = [
            k
            for k, j in cache.all_of_kind("Job", named_as_owner=False)
            if not (j.get("status") or {}).get("conditions")
        ]
        most = max(most, len(running_now))
        assert len(running_now) <= limit, (round_, running_now)
    assert sorted(started) == names
    assert most == limit


def test_a_deleted_services_pass_takes_it_out_of_both_queues_at_once() -> None:
    """Not after STALE_S: a deleted service queued ahead of others held them up for a minute (tier 2 in a
    clean clone: earlier tests' services, their namespaces deleted, stood ahead of a new one's profile)."""
    rollouts, profiles = FleetRollouts(1), ProfileBudget(1)
    busy = {("ns", "x")}
    for budget in (rollouts, profiles):
        assert not budget.ask(("ns", "gone"), busy).granted
        assert budget.ask(("ns", "next"), busy).position == 2
    cache = ObjectCache("InferenceService")  # its deletion seen: no longer in the cache
    outcome = core.reconcile(
        JobKube({}),  # type: ignore[arg-type]
        "ns",
        "gone",
        now=lambda: NOW,
        cache=cache,
        rollouts=rollouts,
        profiles=profiles,
    )
    assert outcome.result == "gone"
    for budget in (rollouts, profiles):
        assert budget.queued() == [("ns", "next")]
        assert budget.ask(("ns", "next"), set()).granted


class TerminatingKube(JobKube):
    """Its namespace is being deleted: the API server refuses every new child, as it does then."""

    def apply(self, manifest: Obj, plural: str) -> Obj:
        raise KubeError(
            403,
            "Forbidden",
            f"{manifest['kind']} is forbidden: unable to create new content in "
            "namespace ns because it is being terminated",
        )


def test_a_pass_granted_a_slot_whose_namespace_is_terminating_frees_it_at_once() -> None:
    """Not after GRANT_TTL_S: a service whose namespace was being deleted lost its profile Job first, its
    pass was granted a slot for a new one, could not create it, and held the slot for a minute (tier 2 in
    CI: a later test's second profile Job came 60 s late)."""
    service, other = owner("gone", spec=SLO_SPEC), owner("next", spec=SLO_SPEC)
    cache = ObjectCache("InferenceService")
    for obj in (service, other):
        cache.observe(obj)
    budget = ProfileBudget(1)
    outcome = run_pass(TerminatingKube({"gone": service}), cache, "gone", OLD, profiles=budget)
    assert outcome.result == "gone"
    assert budget.ask(("ns", "next"), set()).granted
