"""Pure functions: why the scheduler leaves an InferenceService's pods Pending, for the Degraded condition.

kube-scheduler writes its verdict into each pod's `PodScheduled` condition (status False, reason
`Unschedulable`), e.g. on Kubernetes 1.36: `0/3 nodes are available: 1 node(s) had untolerated taint(s),
2 Insufficient nvidia.com/gpu. no new claims to deallocate, preemption: 0/3 nodes are available: ...`. Every
node is counted under the first filter it failed, in the scheduler's order (taints, then node affinity and
selector, then resources), so the cause counted on the nodes that got furthest is what keeps the closest
candidates out: that one names the reason. A PreFilter failure (a missing PersistentVolumeClaim) replaces the
per-node counts: `0/3 nodes are available: persistentvolumeclaim "models" not found. not found`. The message
keeps the scheduler's node counts and adds the InferenceService field to change; it carries no time, so the
same verdict gives the same status. No I/O.
"""

from __future__ import annotations

import re
from typing import Any

from pagoda.operator.api.workload import RolloutSpec
from pagoda.operator.resources.meta import GPU_PRODUCT_LABEL
from pagoda.operator.status.pods import PodIssue, pod_condition

Obj = dict[str, Any]
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
_MISSING_CLAIM = re.compile(r'persistentvolumeclaim "([^"]+)" not found')
_UNBOUND_CLAIM = "unbound immediate PersistentVolumeClaims"
_INSUFFICIENT = re.compile(r"\bInsufficient (\S+)")
_NO_MATCH = "didn't match Pod's node affinity/selector"
_TAINT = "untolerated taint"
_TOO_MANY_PODS = "Too many pods"
# Most specific first: a PreFilter verdict, then what the nodes that got furthest in the filters failed on.
RANK = (
    "RolloutBlocked",
    "VolumeClaimNotFound",
    "VolumeClaimNotBound",
    "InsufficientGPU",
    "InsufficientResources",
    "NoMatchingNode",
    "UntoleratedTaint",
    "Unschedulable",
)


def unschedulable_issue(pods: list[Obj], spec: Obj | None = None) -> PodIssue | None:
    """The most specific scheduling verdict among `pods` (then the first pod by name, so the choice is
    stable), naming the pod and the field of `spec` (the InferenceService's spec, as stored) to change;
    None when no pod is unschedulable. Pods being deleted are not looked at."""
    found: list[tuple[int, str, PodIssue]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        verdict = scheduler_message(pod)
        if verdict is None:
            continue
        name = str(meta.get("name", "?"))
        issue = scheduling_issue(name, str(meta.get("namespace") or ""), verdict, spec or {})
        if issue.reason in ("InsufficientGPU", "InsufficientResources") and surge_blocked(
            pod, pods, spec or {}
        ):
            issue = rollout_blocked(name, verdict_summary(verdict))
        found.append((RANK.index(issue.reason), name, issue))
    if not found:
        return None
    found.sort(key=lambda item: item[:2])
    first = found[0][2]
    if len(found) > 1:
        others = len(found) - 1
        s = "s" if others > 1 else ""
        return PodIssue(first.reason, f"{first.message} ({others} more pod{s} unschedulable)")
    return first


def surge_blocked(pod: Obj, pods: list[Obj], spec: Obj) -> bool:
    """Whether `pod` is a new replica of a rollout that may not take an old one down first
    (spec.rollout.maxUnavailable 0): it waits for resources the old replicas hold, and the rollout with it."""
    unavailable = (spec.get("rollout") or {}).get("maxUnavailable", RolloutSpec().max_unavailable)
    if str(unavailable) not in ("0", "0%"):
        return False
    template = _template_hash(pod)
    return template is not None and any(
        _template_hash(other) not in (None, template)
        and not (other.get("metadata") or {}).get("deletionTimestamp")
        and pod_condition(other, "PodScheduled")
        for other in pods
    )


def rollout_blocked(pod: str, summary: str) -> PodIssue:
    return PodIssue(
        "RolloutBlocked",
        f"pod {pod} of the rollout cannot be scheduled ({summary}): the old replicas keep their GPUs until "
        "new ones are Ready (spec.rollout.maxUnavailable 0), and no node has room for one more; set "
        "spec.rollout.maxUnavailable to 1 and spec.rollout.maxSurge to 0 to replace replicas one at a time "
        "in place (one replica fewer while each restarts), or free GPUs",
    )


def _template_hash(pod: Obj) -> str | None:
    """The ReplicaSet's pod-template-hash label: which version of the pod template the pod runs."""
    value = ((pod.get("metadata") or {}).get("labels") or {}).get("pod-template-hash")
    return str(value) if value else None


def scheduler_message(pod: Obj) -> str | None:
    """The scheduler's message when the pod's PodScheduled condition says Unschedulable, else None."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                return str(cond.get("message") or "")
            return None
    return None


def verdict_summary(message: str) -> str:
    """The scheduler's first sentence (`0/3 nodes are available: ...`), without the preemption report."""
    first = " ".join(message.split()).split(". ", 1)[0].rstrip(".")
    return first or "the scheduler gave no reason"


def scheduling_issue(pod: str, namespace: str, message: str, spec: Obj) -> PodIssue:
    """One pod's scheduling verdict as a reason and a message naming the field to change."""
    summary = verdict_summary(message)
    where = f"pod {pod} cannot be scheduled"
    claim = _MISSING_CLAIM.search(message)
    if claim is not None:
        return PodIssue(
            "VolumeClaimNotFound",
            f"{where}: PersistentVolumeClaim {claim.group(1)}{_claim_use(claim.group(1), spec)} does not "
            f"exist{f' in namespace {namespace}' if namespace else ''}; create it, or fix "
            f"{_claim_field(claim.group(1), spec)}",
        )
    if _UNBOUND_CLAIM in message:
        return PodIssue(
            "VolumeClaimNotBound",
            f"{where} ({summary}): a PersistentVolumeClaim it mounts is not bound to a volume; check the "
            "claim's StorageClass and `kubectl describe pvc` (spec.model.uri pvc://, spec.model.cache)",
        )
    gpu = _gpu(spec)
    short = _INSUFFICIENT.findall(summary)
    extended = [name for name in short if "/" in name]
    if extended:
        count = gpu.get("count")
        need = f"{count} free {extended[0]}" if count else f"enough free {extended[0]}"
        check = (
            f" (and that spec.resources.gpu.resourceName {extended[0]} is what the device plugin advertises)"
            if extended[0] != DEFAULT_GPU_RESOURCE
            else ""
        )
        return PodIssue(
            "InsufficientGPU",
            f"{where}: no node has {need} for one replica ({summary}); lower spec.resources.gpu.count "
            f"(with spec.engine.tensorParallelSize), free GPUs or add GPU nodes{check}",
        )
    if short or _TOO_MANY_PODS in summary:
        return PodIssue(
            "InsufficientResources",
            f"{where}: no node has room for one replica ({summary}); lower spec.resources.cpu or "
            "spec.resources.memory, or add nodes",
        )
    if _NO_MATCH in summary:
        return PodIssue(
            "NoMatchingNode",
            f"{where}: no node matches {_selector(spec)} ({summary}); set spec.resources.gpu.product to "
            f"a GPU model your nodes have (node label {GPU_PRODUCT_LABEL}), or fix "
            "spec.scheduling.nodeSelector or spec.scheduling.affinity",
        )
    if _TAINT in summary:
        return PodIssue(
            "UntoleratedTaint",
            f"{where}: the nodes have taints it does not tolerate ({summary}); add a toleration to "
            "spec.scheduling.tolerations (`kubectl describe nodes` shows the taints)",
        )
    return PodIssue("Unschedulable", f"{where}: {summary}; see `kubectl describe pod {pod}`")


def _gpu(spec: Obj) -> Obj:
    gpu = (spec.get("resources") or {}).get("gpu")
    return gpu if isinstance(gpu, dict) else {}


def _model(spec: Obj) -> Obj:
    model = spec.get("model")
    return model if isinstance(model, dict) else {}


def _uri_claim(spec: Obj) -> str | None:
    uri = str(_model(spec).get("uri") or "")
    return uri.removeprefix("pvc://").split("/", 1)[0] if uri.startswith("pvc://") else None


def _cache_claim(spec: Obj) -> str | None:
    cache = _model(spec).get("cache")
    return str(cache["pvc"]) if isinstance(cache, dict) and cache.get("pvc") else None


def _claim_use(claim: str, spec: Obj) -> str:
    if claim == _uri_claim(spec):
        return f" (the model source, spec.model.uri {_model(spec).get('uri')})"
    if claim == _cache_claim(spec):
        return " (the model cache, spec.model.cache.pvc)"
    return ""


def _claim_field(claim: str, spec: Obj) -> str:
    if claim == _uri_claim(spec):
        return "spec.model.uri"
    if claim == _cache_claim(spec):
        return "spec.model.cache.pvc"
    return "the volume that names it"


def _selector(spec: Obj) -> str:
    """The node labels the pods require, as the pod template sets them (scheduling.nodeSelector plus the
    GPU product label from resources.gpu.product)."""
    wanted = dict((spec.get("scheduling") or {}).get("nodeSelector") or {})
    product = _gpu(spec).get("product")
    if product:
        wanted[GPU_PRODUCT_LABEL] = product
    if not wanted:
        return "the pod's node affinity"
    return "the node selector " + ",".join(f"{key}={value}" for key, value in sorted(wanted.items()))
