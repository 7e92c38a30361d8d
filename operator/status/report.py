"""Pure functions: the InferenceService status from what one reconcile pass observed.

No I/O. The pass gathers what it saw into an `Observed` (reconcile/observe.py, which makes the calls) and
`compute_status(owner, observed)` returns the complete status: the conditions (Ready, Progressing,
Degraded, DisruptionTolerant, with spec.slo SLOUnmet, slo.py, and with spec.autoscaling
ScalingMetricsUnavailable, scalingmetrics.py), the replica counts, and the reports of
the replicas, KEDA and the capacity profile (autoscaling, capacity, startup, modelCache, restarts, adapters,
profile, and sizing from autoscaling and profile). A condition keeps its lastTransitionTime unless its
status flips. What keeps replicas from being ready (`blocker`: pods on a lost node, a failing container, an
unschedulable pod, pods the API server refuses, a stuck rollout) makes the service Degraded and is the Ready
condition's reason while replicas are missing, so `kubectl get` shows it.

The conditions read the spec as stored (`owner["spec"]`), not the validated model: an invalid spec still gets
a status, whose messages name the fields as the user wrote them. Whether and how the status is written
is changes.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pagoda.operator.api.routing import waiting_room_seconds
from pagoda.operator.api.status import METRICS_UNAVAILABLE, ROLLOUT_QUEUED, SLO_UNMET
from pagoda.operator.status.admission import replica_failure_issue
from pagoda.operator.status.nodes import lost_node_issue, lost_replicas
from pagoda.operator.status.pods import PodIssue, pods_issue
from pagoda.operator.status.scaling import autoscaling_status
from pagoda.operator.status.scalingmetrics import metrics_condition
from pagoda.operator.status.scheduling import unschedulable_issue
from pagoda.operator.status.sizing import sizing_status
from pagoda.operator.status.slo import slo_condition, status_condition
from pagoda.operator.status.startup import startup_status, typical_seconds
from pagoda.operator.status.times import parse_time

Obj = dict[str, Any]


@dataclass(frozen=True)
class Problem:
    """Something that keeps the operator from acting on an object; `reason` is CamelCase, `message` says
    what a person should do."""

    reason: str
    message: str
    retry: bool = True  # worth retrying later without a change to the InferenceService


@dataclass(frozen=True)
class Verdict:
    """One condition as this pass finds it (`to_dict` makes it the API's Condition, api/status.py, keeping
    its lastTransitionTime while the status stays the same)."""

    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What one pass saw of a service: everything its status is computed from.

    A report that is None was looked for and not found (the field leaves the status); a status field named
    in `kept` was not looked for in this pass (no capacity reader, an invalid spec that plans no restart and
    syncs no adapter, a node cache no Ready replica has reported on yet): its last value stands."""

    deployment: Obj | None
    pods: list[Obj] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    url: str | None = None
    hpa: Obj | None = None  # the HPA KEDA made from the ScaledObject
    scaled_object: Obj | None = None
    capacity: Obj | None = None  # the smallest Ready replica's KV-cache capacity (capacity.py)
    startups: list[Obj] = field(default_factory=list)  # start-up records of the Ready replicas (startup.py)
    model_cache: Obj | None = None  # per node, the models in its cache (spec.model.cache.scope Node)
    restarts: Obj | None = None  # the restart schedule's status (restarts.py)
    adapters: Obj = field(default_factory=dict)  # `adapters`, `adaptersReady` from the adapter sync
    profile: Obj | None = None  # the capacity profile against spec.slo (profile.py)
    rollout_queued: str | None = None  # why the pod template waits for the fleet's rollout budget
    template_inputs: str | None = None  # reconcile/rollouts.py inputs_hash; None: not computed (kept)
    # The Nodes the pods run on, slim (nodes.py), by name; a name missing: no such Node; None: not known.
    nodes: dict[str, Obj] | None = None
    kept: frozenset[str] = frozenset()


def compute_status(owner: Obj, observed: Observed, *, selector: str, now: str) -> Obj:
    """The whole status of `owner` for this pass; `now` is an RFC 3339 timestamp."""
    generation = int(owner.get("metadata", {}).get("generation", 0))
    previous_status = owner.get("status") or {}
    previous = {c.get("type"): c for c in previous_status.get("conditions") or []}
    deployment, problems = observed.deployment, observed.problems
    st = (deployment or {}).get("status") or {}
    want = desired_replicas(deployment) if deployment is not None else 0
    spec = owner.get("spec") or {}
    stop = (
        blocker(deployment, observed.pods, spec, parse_time(now), observed.nodes)
        if deployment is not None
        else None
    )
    conditions = [
        ready_condition(deployment, problems, stop, waiting_room=scale_from_zero_wait(owner)),
        progressing_condition(deployment, problems),
        degraded_condition(deployment, problems, stop),
        disruption_condition(deployment, spec),
    ]
    # An invalid spec looks at no profile: the last status.profile stands (`kept`), and SLOUnmet reads it.
    profile = previous_status.get("profile") if "profile" in observed.kept else observed.profile
    slo = slo_condition(spec, profile)
    if slo is not None:
        conditions.append(Verdict(SLO_UNMET, *slo))
    metrics = metrics_condition(observed.scaled_object, observed.hpa, parse_time(now))
    if metrics is not None:
        conditions.append(Verdict(METRICS_UNAVAILABLE, *metrics))
    if observed.rollout_queued is not None:
        conditions.append(Verdict(ROLLOUT_QUEUED, True, "WaitingForRolloutSlot", observed.rollout_queued))
    status: Obj = {
        "observedGeneration": generation,
        "conditions": [to_dict(c, previous.get(c.type), generation, now) for c in conditions],
        "replicas": int(st.get("replicas") or 0),
        "readyReplicas": int(st.get("readyReplicas") or 0),
        "readySummary": f"{int(st.get('readyReplicas') or 0)}/{want}",
        "selector": selector,
    }
    inputs = observed.template_inputs or previous_status.get("podTemplateInputs")
    if inputs:
        status["podTemplateInputs"] = inputs
    if observed.url:
        status["url"] = observed.url
    if observed.hpa is not None and observed.scaled_object is not None:
        status["autoscaling"] = autoscaling_status(
            observed.hpa, observed.scaled_object, previous_status.get("autoscaling")
        )
    # The starts seen so far are kept also when no replica runs: where start-up time goes is history.
    reports = {
        "capacity": observed.capacity,
        "startup": startup_status(previous_status.get("startup"), observed.startups),
        "modelCache": observed.model_cache,
        "restarts": observed.restarts,
        "profile": observed.profile,
        "sizing": sizing_status(
            spec,
            observed.profile,
            status.get("autoscaling"),
            status["readyReplicas"],
            observed.scaled_object,
        ),
    }
    status.update({key: value for key, value in reports.items() if value is not None})
    status.update(observed.adapters)
    status.update({key: previous_status[key] for key in observed.kept if key in previous_status})
    return status


def to_dict(condition: Verdict, previous: Obj | None, generation: int, now: str) -> Obj:
    value = "True" if condition.status else "False"
    kept = previous.get("lastTransitionTime") if previous and previous.get("status") == value else None
    return {
        "type": condition.type,
        "status": value,
        "reason": condition.reason,
        "message": condition.message,
        "observedGeneration": generation,
        "lastTransitionTime": kept or now,
    }


def desired_replicas(deployment: Obj) -> int:
    replicas = (deployment.get("spec") or {}).get("replicas")
    return 1 if replicas is None else int(replicas)


def rollout_done(deployment: Obj) -> bool:
    """The Deployment controller has seen the latest spec and every replica runs it and is available."""
    st = deployment.get("status") or {}
    want = desired_replicas(deployment)
    seen = int(st.get("observedGeneration") or 0) >= int(deployment.get("metadata", {}).get("generation", 0))
    updated = int(st.get("updatedReplicas") or 0)
    total = int(st.get("replicas") or 0)
    available = int(st.get("availableReplicas") or 0)
    return seen and updated >= want and total <= updated and available >= want


def _deployment_condition(deployment: Obj | None, type_: str) -> Obj | None:
    return status_condition((deployment or {}).get("status") or {}, type_)


def blocker(
    deployment: Obj,
    pods: list[Obj],
    spec: Obj,
    now: datetime | None,
    nodes: dict[str, Obj] | None = None,
) -> PodIssue | None:
    """What keeps the replicas from running, most specific first: pods on a node that stopped reporting
    (NodeLost, nodes.py; what else blocks replicas follows in its message), a failing container (its
    runtime's own reason, OOM, image, startup timeout), an unschedulable pod, pods the API server refuses to
    create (the Deployment's ReplicaFailure), a rollout past its progress deadline; None when nothing does.
    A pod on a lost node is left out of the others: its statuses are the last its kubelet reported."""
    lost = lost_replicas(pods, nodes)
    if not lost:
        return _replica_blocker(deployment, pods, spec, now)
    gone = {id(pod) for _, group in lost for pod in group}
    issue = lost_node_issue(lost)
    other = _replica_blocker(deployment, [p for p in pods if id(p) not in gone], spec, now)
    if issue is None or other is None:
        return issue or other
    return PodIssue(issue.reason, f"{issue.message}. Also {other.reason}: {other.message}")


def _replica_blocker(deployment: Obj, pods: list[Obj], spec: Obj, now: datetime | None) -> PodIssue | None:
    found = pods_issue(pods, now) or unschedulable_issue(pods, spec)
    if found is not None:
        return found
    failure = _deployment_condition(deployment, "ReplicaFailure")
    if failure and failure.get("status") == "True":
        return replica_failure_issue(failure, spec)
    stuck = _deployment_condition(deployment, "Progressing")
    if stuck and stuck.get("status") == "False":
        return PodIssue(
            "RolloutStuck",
            f"The Deployment's rollout exceeded its progress deadline: {stuck.get('message', '')}",
        )
    return None


def scale_from_zero_wait(owner: Obj) -> int | None:
    """Seconds the endpoint picker holds a request while an autoscaled, routed service (spec.routing and
    spec.autoscaling) starts its first replica (api/routing.py waiting_room_seconds); None for a service
    that nothing wakes from zero."""
    spec = owner.get("spec") or {}
    routing, autoscaling = spec.get("routing"), spec.get("autoscaling")
    if not isinstance(routing, dict) or not autoscaling:
        return None
    timeout = (routing.get("endpointPicker") or {}).get("queueTimeoutSeconds")
    typical = typical_seconds((owner.get("status") or {}).get("startup"))
    return waiting_room_seconds(timeout if isinstance(timeout, int) else None, typical)


def ready_condition(
    deployment: Obj | None,
    problems: list[Problem],
    stop: PodIssue | None = None,
    waiting_room: int | None = None,
) -> Verdict:
    """Ready when every desired replica is; at zero replicas only when a request wakes the service
    (`waiting_room`, scale_from_zero_wait's seconds): the endpoint picker then holds it while KEDA starts a
    replica."""
    if deployment is None:
        if problems:
            return Verdict("Ready", False, problems[0].reason, problems[0].message)
        return Verdict("Ready", False, "DeploymentMissing", "The Deployment has not been created yet")
    want = desired_replicas(deployment)
    ready = int((deployment.get("status") or {}).get("readyReplicas") or 0)
    if want == 0 and waiting_room is not None:
        return Verdict(
            "Ready",
            True,
            "ScaledToZero",
            f"No replica runs; the endpoint picker holds each request for up to {waiting_room} s while KEDA "
            "starts one (then 503)",
        )
    if want == 0:
        return Verdict("Ready", False, "ScaledToZero", "The Deployment is scaled to 0 replicas")
    if ready >= want:
        return Verdict("Ready", True, "ReplicasReady", f"{ready}/{want} replicas are ready")
    if stop is not None:
        return Verdict(
            "Ready", False, stop.reason, f"{ready}/{want} replicas are ready; the Degraded condition says why"
        )
    return Verdict("Ready", False, "ReplicasNotReady", f"{ready}/{want} replicas are ready")


def progressing_condition(deployment: Obj | None, problems: list[Problem]) -> Verdict:
    stuck = _deployment_condition(deployment, "Progressing")
    if stuck and stuck.get("status") == "False":
        return Verdict(
            "Progressing", False, str(stuck.get("reason") or "RolloutStuck"), str(stuck.get("message") or "")
        )
    if deployment is None:
        if problems:
            return Verdict("Progressing", False, problems[0].reason, problems[0].message)
        return Verdict("Progressing", True, "Creating", "Creating the Deployment")
    if rollout_done(deployment):
        return Verdict("Progressing", False, "RolloutComplete", "Every replica runs the latest spec")
    st = deployment.get("status") or {}
    want = desired_replicas(deployment)
    return Verdict(
        "Progressing",
        True,
        "RollingOut",
        f"{int(st.get('updatedReplicas') or 0)}/{want} replicas updated, "
        f"{int(st.get('availableReplicas') or 0)}/{want} available",
    )


def degraded_condition(
    deployment: Obj | None, problems: list[Problem], stop: PodIssue | None = None
) -> Verdict:
    """The operator's own problems first, then what blocks the replicas (see `blocker`)."""
    if problems:
        reason = problems[0].reason
        return Verdict("Degraded", True, reason, "; ".join(p.message for p in problems))
    if stop is not None:
        return Verdict("Degraded", True, stop.reason, stop.message)
    return Verdict("Degraded", False, "Reconciled", "Every child object matches the spec")


def disruption_condition(deployment: Obj | None, spec: Obj) -> Verdict:
    """DisruptionTolerant: whether a voluntary disruption (a node drain, the eviction API) leaves a
    replica serving. The PodDisruptionBudget lets an eviction through while fewer than
    `spec.disruption.maxUnavailable` replicas are down (a percentage of the replicas, rounded up, as the
    disruption controller counts it), so a budget at or above the replica count lets one drain take every
    replica: False, with what to change. Not Degraded: nothing is wrong until a drain comes, and many
    services run one replica on purpose; the risk is reported where a person (or an alert) can see it
    without the service reading as broken."""
    want = desired_replicas(deployment) if deployment is not None else 0
    if want == 0:
        return Verdict("DisruptionTolerant", True, "NoReplicas", "No replica runs, so a drain evicts none")
    budget = (spec.get("disruption") or {}).get("maxUnavailable", 1)
    allowed = _scaled(budget, want)
    setting = f"spec.disruption.maxUnavailable {budget}"
    if allowed <= 0:
        return Verdict(
            "DisruptionTolerant",
            True,
            "EvictionsBlocked",
            f"The PodDisruptionBudget refuses every eviction ({setting}): a node drain waits on this "
            f"service's pods until you change it",
        )
    if allowed < want:
        return Verdict(
            "DisruptionTolerant",
            True,
            "ReplicasKeptDuringDrain",
            f"A drain evicts at most {allowed} of {want} replicas at once ({setting}); the rest keep serving",
        )
    more = "autoscaling.minReplicas" if spec.get("autoscaling") else "spec.replicas"
    return Verdict(
        "DisruptionTolerant",
        False,
        "DrainTakesEveryReplica",
        f"A node drain may evict all {want} replica(s) at once ({setting}): the service is down until a "
        f"replacement loads its model. Set {more} to {allowed + 1} or more to keep one serving, or "
        f"spec.disruption.maxUnavailable to 0 to make drains wait for you",
    )


def _scaled(value: Any, replicas: int) -> int:
    """An int-or-percent budget as a replica count: a percentage of `replicas`, rounded up (the disruption
    controller's rounding for maxUnavailable)."""
    if isinstance(value, str) and value.endswith("%"):
        return -(-int(value[:-1]) * replicas // 100)
    return int(value)
