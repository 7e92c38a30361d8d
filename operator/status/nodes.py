"""Pure functions: replicas on a node that stopped reporting, for the Degraded condition (`NodeLost`).

When a node's kubelet stops (the machine crashed, the network split, the kubelet died), the node lifecycle
controller of kube-controller-manager sets the Node's Ready condition to Unknown once its lease has not
been renewed for --node-monitor-grace-period (50 s by default), taints the node
node.kubernetes.io/unreachable:NoExecute and sets the Ready condition of its pods to False: the Service
stops sending them requests and the Deployment's ready replicas drop. A kubelet that reports its node not
ready (Ready False) gets node.kubernetes.io/not-ready the same way. The taint-eviction controller deletes a
pod once it has tolerated the taint for the pod's tolerationSeconds (300 s: the DefaultTolerationSeconds
admission plugin gives every pod that sets none that toleration of both taints); the ReplicaSet then
starts a replacement on another node at once, while the deleted pod stays Terminating until the kubelet
confirms, which a node that never returns never does. Deleting the Node object ends that: the pod
garbage collector deletes the pods bound to a node that does not exist.

`lost_replicas` finds the pods on such nodes from the Nodes the operator watches (a slim copy of each,
`slim_node`), and `lost_node_issue` says which pods, which node, since when, and what happens next. A pod
whose node is Ready again (and untainted) is no longer lost. The messages carry the times the cluster
recorded (when the node stopped, when the pod is evicted), never the current time, so the same cluster
state gives the same status. No I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pagoda.operator.status.pods import PodIssue, clip, pod_condition
from pagoda.operator.status.times import parse_time, rfc3339

Obj = dict[str, Any]
NODE_KIND = ("v1", "Node", "nodes")  # (apiVersion, kind, plural): watched (all of them) and cached slim
UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
LIFECYCLE_TAINTS = (UNREACHABLE_TAINT, NOT_READY_TAINT)
REASON = "NodeLost"


def slim_node(node: Obj) -> Obj:
    """What the status needs of a Node: its name, its Ready condition (without the heartbeat time, which
    changes with every report) and the node lifecycle controller's taints."""
    meta = node.get("metadata") or {}
    slim: Obj = {"metadata": {key: meta[key] for key in ("name", "uid", "resourceVersion") if key in meta}}
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Ready"), None)
    if ready is not None:
        keep = ("status", "reason", "message", "lastTransitionTime")
        slim["ready"] = {key: ready[key] for key in keep if key in ready}
    taints = [
        {key: taint[key] for key in ("key", "effect", "timeAdded") if key in taint}
        for taint in (node.get("spec") or {}).get("taints") or []
        if isinstance(taint, dict) and taint.get("key") in LIFECYCLE_TAINTS
    ]
    if taints:
        slim["taints"] = taints
    return slim


def health(slim: Obj | None) -> Obj | None:
    """The part of a slim Node whose change can change a status (no resourceVersion); None: no Node."""
    if slim is None:
        return None
    return {"ready": slim.get("ready"), "taints": slim.get("taints")}


@dataclass(frozen=True)
class Loss:
    """A node that keeps its pods from serving. `what`: what happened to it, after "node <name>, which";
    `taint_key`: the lifecycle taint whose toleration times the eviction, `taint_added` when it was put on
    the node (None: not yet); `gone`: the Node object no longer exists."""

    node: str
    what: str
    taint_key: str | None = None
    taint_added: str | None = None
    gone: bool = False


def node_loss(name: str, node: Obj | None) -> Loss | None:
    """How node `name` (its slim copy; None when the Node does not exist) keeps its pods from serving;
    None when it is Ready and carries no NoExecute lifecycle taint."""
    if node is None:
        return Loss(name, "no longer exists (its Node object was deleted)", gone=True)
    taints = [t for t in node.get("taints") or [] if t.get("effect") == "NoExecute"]
    taint = next((t for t in taints if t.get("key") == UNREACHABLE_TAINT), taints[0] if taints else None)
    ready = node.get("ready") or {}
    status = ready.get("status")
    if status in ("Unknown", "False"):
        cause = ", ".join(str(ready[key]) for key in ("reason", "message") if ready.get(key))
        verb = "stopped reporting" if status == "Unknown" else "reports itself not ready"
        since = f" at {ready['lastTransitionTime']}" if ready.get("lastTransitionTime") else ""
        default_key = UNREACHABLE_TAINT if status == "Unknown" else NOT_READY_TAINT
        return Loss(
            name,
            f"{verb}{since} (Ready {status}{': ' + clip(cause) if cause else ''})",
            str(taint["key"]) if taint else default_key,
            str(taint["timeAdded"]) if taint and taint.get("timeAdded") else None,
        )
    if taint is not None:
        added = f" at {taint['timeAdded']}" if taint.get("timeAdded") else ""
        return Loss(
            name,
            f"was tainted {taint['key']}{added} (its Ready condition {status or 'not reported'})",
            str(taint["key"]),
            str(taint["timeAdded"]) if taint.get("timeAdded") else None,
        )
    return None


def lost_replicas(pods: list[Obj], nodes: Mapping[str, Obj] | None) -> list[tuple[Loss, list[Obj]]]:
    """The pods on lost nodes, grouped by node (by name, the pods by name too, so the message is stable).
    `nodes`: the Nodes the pods run on, as the operator's cache holds them (a node it does not hold does not
    exist); None when the operator cannot see Nodes: then nothing is lost. A pod without a node (not yet
    scheduled) is on none. A Ready pod on a node the cache does not hold is not counted: the pod's watch may
    be ahead of the Node's (a Node deleted while its pods were Ready, e.g. by a cluster autoscaler after a
    drain, goes unreported: the pod garbage collector deletes those pods within its 40 s quarantine)."""
    if nodes is None:
        return []
    by_node: dict[str, list[Obj]] = {}
    for pod in sorted(pods, key=_name):
        node = (pod.get("spec") or {}).get("nodeName")
        if isinstance(node, str) and node:
            by_node.setdefault(node, []).append(pod)
    found = []
    for name in sorted(by_node):
        loss = node_loss(name, nodes.get(name))
        if loss is None:
            continue
        group = [p for p in by_node[name] if not (loss.gone and pod_condition(p, "Ready"))]
        if group:
            found.append((loss, group))
    return found


def lost_node_issue(lost: list[tuple[Loss, list[Obj]]]) -> PodIssue | None:
    """`NodeLost`, naming every pod on a lost node, the node, since when, and what happens next: the
    eviction and the replacement elsewhere, or what a person does when the node is gone for good."""
    clauses: list[str] = []
    for loss, pods in lost:
        node = loss.node
        if loss.gone:
            clauses.append(
                f"{_pods(pods)} {_n(pods, 'was', 'were')} on node {node}, which {loss.what}: the pod garbage "
                f"collector deletes {_n(pods, 'it', 'them')} and the Deployment replaces "
                f"{_n(pods, 'it', 'them')} on another node"
            )
            continue
        serving = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
        deleting = [p for p in pods if (p.get("metadata") or {}).get("deletionTimestamp")]
        if serving:
            clauses.append(
                f"{_pods(serving)} on node {node}, which {loss.what}: "
                f"{_n(serving, 'it serves', 'they serve')} no requests; "
                f"{_eviction(serving[0], loss, len(serving))}; if the node is gone for good, delete it "
                f"(`kubectl delete node {node}`) to replace {_n(serving, 'it', 'them')} now"
            )
        if deleting:
            namespace = str((deleting[0].get("metadata") or {}).get("namespace") or "")
            names = " ".join(_name(p) for p in deleting) + (f" -n {namespace}" if namespace else "")
            clauses.append(
                f"{_pods(deleting)} on node {node}, which {loss.what}, {_n(deleting, 'was', 'were')} deleted "
                f"but {_n(deleting, 'stays', 'stay')} Terminating until the node reports again (the "
                f"Deployment has started {_n(deleting, 'a replacement', 'replacements')} on another node); "
                f"if the node is gone for good, delete it (`kubectl delete node {node}`), or force-delete "
                f"{_n(deleting, 'the pod', 'the pods')} once you know the node is down (`kubectl delete pod "
                f"{names} --force --grace-period=0`)"
            )
    if not clauses:
        return None
    return PodIssue(REASON, clip("; ".join(clauses)))


def toleration_seconds(pod: Obj, key: str) -> int | None:
    """Seconds `pod` stays on a node tainted `key`:NoExecute before the taint-eviction controller deletes
    it: the shortest tolerationSeconds of the tolerations that match, 0 when none matches (evicted at once),
    None when those that match set no limit (never evicted)."""
    matching = [
        t
        for t in (pod.get("spec") or {}).get("tolerations") or []
        if isinstance(t, dict)
        and (t.get("key") == key or (not t.get("key") and t.get("operator") == "Exists"))
        and t.get("effect") in (None, "", "NoExecute")
    ]
    if not matching:
        return 0
    limits: list[int] = [
        t["tolerationSeconds"] for t in matching if isinstance(t.get("tolerationSeconds"), int)
    ]
    if not limits:
        return None
    return max(min(limits), 0)


def _eviction(pod: Obj, loss: Loss, count: int) -> str:
    """What happens to the pod(s) next, as the pod's tolerations say: when the taint-eviction controller
    deletes them, and their replacement."""
    key = loss.taint_key or UNREACHABLE_TAINT
    seconds = toleration_seconds(pod, key)
    them = "it" if count == 1 else "them"
    replace = f"the Deployment starts {'a replacement' if count == 1 else 'replacements'} on another node"
    if seconds is None:
        return (
            f"{'it tolerates' if count == 1 else 'they tolerate'} {key} without a time limit, so nothing "
            f"evicts {them} and the Deployment starts no replacement"
        )
    added = parse_time(loss.taint_added)
    if added is None:
        return (
            f"the node lifecycle controller taints the node {key}, evicts {them} {seconds} s later, and "
            f"{replace}"
        )
    at = rfc3339(added + timedelta(seconds=seconds))
    return (
        f"the taint-eviction controller evicts {them} at {at} ({key} tolerated for {seconds} s) and {replace}"
    )


def _name(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def _pods(pods: list[Obj]) -> str:
    return f"pod {_name(pods[0])}" if len(pods) == 1 else "pods " + ", ".join(_name(p) for p in pods)


def _n(pods: list[Obj], one: str, many: str) -> str:
    return one if len(pods) == 1 else many
