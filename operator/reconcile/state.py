"""What one reconcile pass carries from step to step (`Pass`): the owner, its live children and pods as the
pass finds and changes them, the problems met, the writes and changes made, when to look again. Its own
module so that each step's module (observe.py, apply.py, core.py) can take it without importing another."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pagoda.operator.kube.adapters import AdapterReport
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.capacity import CapacityReader
from pagoda.operator.kube.client import Kube
from pagoda.operator.reconcile import events, restarts
from pagoda.operator.reconcile.budget import Turn
from pagoda.operator.status.report import Problem

log = logging.getLogger("pagoda.operator.reconcile")

Obj = dict[str, Any]
ChildKey = tuple[str, str]  # (kind, name)


class OwnerGone(Exception):
    """The InferenceService or its namespace went away during the pass: there is nothing left to do."""


def child_key(manifest: Obj) -> ChildKey:
    return manifest["kind"], manifest["metadata"]["name"]


@dataclass
class Pass:
    """One pass over one InferenceService: its live children and pods, the problems met, the writes made."""

    kube: Kube
    cache: ObjectCache | None
    owner: Obj
    namespace: str
    name: str
    now: Callable[[], str]
    live: dict[ChildKey, Obj]
    pods: list[Obj]
    problems: list[Problem]
    hpa: Obj | None = None  # the HPA KEDA made from our ScaledObject (watched, not ours to apply)
    capacity: CapacityReader | None = None
    adapters: AdapterReport | None = None  # spec.lora's adapters in the Ready pods (kube/adapters.py)
    restart: restarts.RestartPlan | None = None  # the restart schedule after this pass's writes
    node_cache: bool = False  # spec.model.cache.scope Node: status.modelCache reports the nodes' caches
    rollout: Turn | None = None  # the pod template held for the fleet's rollout budget (rollouts.py)
    profile_wait: tuple[str, Turn] | None = None  # a new profile Job held for the fleet's budget (profile.py)
    template_inputs: str | None = None  # the pass's rollouts.inputs_hash (status.podTemplateInputs)
    writes: int = 0
    changes: list[tuple[str, str, str]] = field(default_factory=list)  # (verb, kind, name) of children
    requeue: list[float] = field(default_factory=list)  # seconds after which to look again

    def wrote(self, verb: str, kind: str, child: str) -> None:
        """Count a write to a child and log it; `record_changes` names it in the pass's Event."""
        self.writes += 1
        self.changes.append((verb, kind, child))
        log.info("%s %s name=%s namespace=%s", verb, kind, child, self.namespace)

    def record_changes(self) -> None:
        """One Event on the owner naming every child this pass created, updated or deleted
        (docs/operator.md#events)."""
        if self.changes:
            reason, message = events.changes_event(self.changes)
            self.event("Normal", reason, message)
            self.changes = []

    def event(self, type_: str, reason: str, message: str) -> None:
        events.record(self.kube, self.owner, type_=type_, reason=reason, message=message, now=self.now())
