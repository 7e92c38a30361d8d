"""The children one pass wants: the builders' manifests (resources/) from the spec, the operator's settings
and what the owner's status and the restart plan add to them (`ChildInputs`), with owner references; and the
replica count a new autoscaled Deployment starts at. Pure: the pass has read everything already."""

from __future__ import annotations

from typing import Any

from pagoda.operator.api import API_VERSION, KIND, InferenceServiceSpec
from pagoda.operator.reconcile.restarts import RestartPlan
from pagoda.operator.resources import (
    PROFILE_REQUEST_ANNOTATION,
    ChildInputs,
    OperatorSettings,
    RestartStamps,
    desired_children,
)
from pagoda.operator.status.profile import slo_concurrency, tuned_engine
from pagoda.operator.status.startup import typical_seconds

Obj = dict[str, Any]


def desired_state(
    owner: Obj,
    spec: InferenceServiceSpec,
    settings: OperatorSettings,
    restart: RestartPlan | None = None,
    chat_template: str | None = None,
) -> list[Obj]:
    """The children the spec asks for, with owner references. Anything a builder raises is a bug (the spec
    was validated), and propagates: the work queue logs it with its traceback and retries with back-off.
    `restart`: the restart plan, whose times the Deployment carries (restarts.py); `chat_template`: the
    template read from spec.engine.chatTemplate.configMap (chattemplate.py)."""
    return owned_children(owner, spec, child_inputs(owner, settings, restart, chat_template))


def owned_children(owner: Obj, spec: InferenceServiceSpec, inputs: ChildInputs) -> list[Obj]:
    """desired_state from the pass's `inputs` (child_inputs), for a pass that reads them itself too."""
    meta = owner["metadata"]
    children = desired_children(meta["name"], meta["namespace"], spec, inputs)
    return [with_owner(manifest, owner) for manifest in children]


def child_inputs(
    owner: Obj,
    settings: OperatorSettings,
    restart: RestartPlan | None,
    chat_template: str | None,
    budget_limit: int | None = None,
) -> ChildInputs:
    """What the builders read besides the spec: the settings, the restart plan's times, the chat template,
    the GPUBudget's limit, and from the owner its profile annotation and what its status says of start-up and
    the last profile."""
    status = owner.get("status") or {}
    return ChildInputs(
        settings=settings,
        stamps=RestartStamps(restart.restarted_at, restart.since) if restart else RestartStamps(),
        chat_template=chat_template,
        typical_start=typical_seconds(status.get("startup")),
        profile_request=(owner["metadata"].get("annotations") or {}).get(PROFILE_REQUEST_ANNOTATION),
        slo_concurrency=slo_concurrency(status.get("profile")),
        engine_choice=tuned_engine(status.get("profile")),
        budget_limit=budget_limit,
    )


def owner_reference(owner: Obj) -> Obj:
    meta = owner["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def with_owner(manifest: Obj, owner: Obj) -> Obj:
    metadata = {**manifest["metadata"], "ownerReferences": [owner_reference(owner)]}
    return {**manifest, "metadata": metadata}


def start_at_min_replicas(desired: list[Obj], spec: InferenceServiceSpec, live: Obj | None) -> None:
    """A new autoscaled Deployment is created at autoscaling.minReplicas. Without spec.replicas the API
    server would default it to 1: a service at minReplicas 0 would start a replica (an engine, a GPU) only
    for KEDA to remove it, one at 3 would start one and wait for the HPA. From the next pass the field is
    the HPA's (apply.py `hand_over_replicas`, as when autoscaling is turned on)."""
    if spec.autoscaling is None or live is not None:
        return
    for manifest in desired:
        if manifest["kind"] == "Deployment":
            manifest["spec"] = {"replicas": spec.autoscaling.min_replicas, **manifest["spec"]}
