"""Fleet-wide rollouts: what an operator upgrade may restart (docs/design/2026-12-06-operator-upgrades.md).

Each pass records in the InferenceService's status `podTemplateInputs`, a hash of what the service alone
decides about its pods (`inputs_hash`): its spec and the pass's ChildInputs (restart stamps, chat template,
profile results), not the operator's settings or its code. A pass that would change the live Deployment's
pod template so finds out why (`classify`), comparing its hash with the one the last pass recorded:
- OWN: the service's inputs changed (a spec change, a scheduled restart, a new profile result): the new
  template is applied at once, as always;
- FLEET: the inputs are those of the last pass, so the change comes from the operator (a new release's
  defaults, its runtime image, a chart value): the template waits for a slot of the fleet's rollout budget
  (`FleetRollouts`, the chart's rollouts.maxConcurrent, default 1). While it waits the pass applies all else
  with the live pod template (`hold`), so nothing rolls, and the status says `RolloutQueued` with the
  service's place in the queue; once granted, the Deployment is applied with the new template and
  FLEET_ROLLOUT_ANNOTATION, and counts against the budget until its rollout is over (`rolling`).
A status written by an operator before the hash (0.1.0) has none: the inputs count as unchanged when its
observedGeneration is the InferenceService's generation (the old operator applied this spec), as changed
otherwise. The hash lives in the status, not on the Deployment, so that a spec change that leaves the pods
alone (a LoRA adapter, autoscaling bounds) writes no child: the status is written for it anyway.

The budget is the leader's, in memory; after a restart (or a hand-over) it is rebuilt from what the
Deployments say: those with FLEET_ROLLOUT_ANNOTATION still rolling hold their slots. Only the runtime
Deployment is budgeted (its pods hold GPUs); the endpoint picker's roll at once.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any

from pagoda.operator import metrics
from pagoda.operator.reconcile.budget import FleetBudget, Key, Turn
from pagoda.operator.reconcile.compare import differences, stale_fields
from pagoda.operator.resources import ChildInputs
from pagoda.operator.resources.meta import content_hash
from pagoda.operator.status.report import desired_replicas

Obj = dict[str, Any]

FLEET_ROLLOUT_ANNOTATION = "pagoda.dev/fleet-rollout"
DEFAULT_MAX_CONCURRENT = 1
QUEUED_RECHECK_S = 5.0  # how often a queued service's pass looks for a free slot


class Change(Enum):
    NONE = "none"  # no live Deployment yet, or the pod template is unchanged
    OWN = "own"  # the service's own inputs changed
    FLEET = "fleet"  # only the operator's template changed


def inputs_hash(spec: Obj, inputs: ChildInputs) -> str:
    """A short hash of what the service alone decides about its runtime pods: `spec` (the InferenceService's,
    as stored) and the fields of `inputs` the runtime Deployment reads (not the operator's settings, nor the
    typical start, which only the ScaledObject's warm-up and the picker read)."""
    own = {
        f.name: getattr(inputs, f.name)
        for f in dataclasses.fields(inputs)
        if f.name not in ("settings", "typical_start")
    }
    own["stamps"] = dataclasses.asdict(inputs.stamps)
    return content_hash(
        json.dumps({"spec": spec, "inputs": own}, sort_keys=True, separators=(",", ":"), default=str)
    )


def template_changed(desired: Obj, live: Obj) -> bool:
    """Whether applying `desired` would change `live`'s pod template (a rollout): a field with another
    value, or one the last apply set that `desired` drops."""
    want = desired.get("spec", {}).get("template", {})
    have = live.get("spec", {}).get("template", {})
    if differences(want, have):
        return True
    return any(path.startswith("spec.template") for path in stale_fields(desired, live))


def classify(desired: Obj, live: Obj | None, owner: Obj, inputs: str) -> Change:
    """Why `desired` (the runtime Deployment, from inputs hashed to `inputs`) would roll `live`, if it would;
    `owner`: the InferenceService as the pass read it (its status says the last pass's hash)."""
    if live is None or not template_changed(desired, live):
        return Change.NONE
    was = (owner.get("status") or {}).get("podTemplateInputs")
    if was is None:  # the status of an operator before the hash
        return Change.FLEET if applied_before_the_hash(owner) else Change.OWN
    return Change.FLEET if was == inputs else Change.OWN


def applied_before_the_hash(owner: Obj) -> bool:
    """Whether `owner`'s status is an operator's from before status.podTemplateInputs (0.1.0) that saw its
    current spec: no hash, and its observedGeneration is the generation."""
    status = owner.get("status") or {}
    return "podTemplateInputs" not in status and status.get("observedGeneration") == owner["metadata"].get(
        "generation"
    )


def hold(desired: Obj, live: Obj) -> None:
    """Keeps `live`'s pod template in `desired`, and the mark of the fleet rollout that made it (all else
    is applied)."""
    desired["spec"]["template"] = live["spec"]["template"]
    carry_grant(desired, live)


def carry_grant(desired: Obj, live: Obj | None) -> None:
    """A Deployment whose template is unchanged keeps the mark of the fleet rollout that made it (dropping
    it would be a write of its own)."""
    mark = _annotations(live or {}).get(FLEET_ROLLOUT_ANNOTATION)
    if mark is not None:
        desired["metadata"].setdefault("annotations", {})[FLEET_ROLLOUT_ANNOTATION] = mark


def rolling(deployment: Obj) -> bool:
    """Whether `deployment` is mid-rollout: the controller has not seen its last change, or some replicas
    still run an older template. A rollout past its progress deadline (Progressing False) no longer is:
    it is stuck (its service's status says why) and holds no slot."""
    status = deployment.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Progressing" and condition.get("status") == "False":
            return False
    if int(status.get("observedGeneration") or 0) < int(deployment["metadata"].get("generation") or 0):
        return True
    want = desired_replicas(deployment)
    updated = int(status.get("updatedReplicas") or 0)
    return updated < want or int(status.get("replicas") or 0) > updated


def fleet_rolling(deployments: Iterable[tuple[Key, Obj]]) -> set[Key]:
    """The services whose Deployment rolls for a fleet rollout (it carries FLEET_ROLLOUT_ANNOTATION)."""
    return {key for key, d in deployments if FLEET_ROLLOUT_ANNOTATION in _annotations(d) and rolling(d)}


class FleetRollouts(FleetBudget):
    """The budget of fleet rollouts at once (budget.py): busy are the services whose Deployment rolls for a
    fleet rollout (`fleet_rolling`)."""

    def __init__(
        self, max_concurrent: int = DEFAULT_MAX_CONCURRENT, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(max_concurrent, "rollouts.maxConcurrent", metrics.ROLLOUTS_QUEUED, clock)


def rollout_message(turn: Turn) -> str:
    """The condition RolloutQueued's message for a held template."""
    return (
        f"the operator's pod template changed (an upgrade): this service's rollout waits for a slot, "
        f"{turn.position} of {turn.queued} in the queue; {turn.busy} of {turn.limit} fleet rollouts "
        "under way (rollouts.maxConcurrent)"
    )


def budget_template(
    desired: list[Obj],
    live: Obj | None,
    owner: Obj,
    inputs: str,
    budget: FleetRollouts | None,
    deployments: Callable[[], Iterable[tuple[Key, Obj]]],
    now: str,
) -> Turn | None:
    """Puts the pass's runtime Deployment (in `desired`, against `live`) under the fleet's rollout budget: a
    FLEET change is applied with FLEET_ROLLOUT_ANNOTATION (`now`) when the budget grants it, and held
    (`hold`) otherwise; returns the Turn of a held one, else None. `inputs`: the pass's `inputs_hash`;
    `deployments`: every service's live Deployment (for `fleet_rolling`). Without a budget (a pass run
    alone, from a test) every change applies at once."""
    meta = owner["metadata"]
    key = (meta["namespace"], meta["name"])
    manifest = next(
        (m for m in desired if m["kind"] == "Deployment" and m["metadata"]["name"] == key[1]), None
    )
    if manifest is None:
        return None
    change = classify(manifest, live, owner, inputs)
    if change is Change.NONE:
        carry_grant(manifest, live)
        if budget is not None:
            budget.forget(key)  # not waiting (any more: e.g. the operator's change was undone)
            if live is not None and not rolling(live):
                budget.finished(key)
        return None
    if budget is None:
        return None
    if change is Change.OWN:
        budget.forget(key)
        return None
    assert live is not None  # classify: a change needs a live Deployment
    turn = budget.ask(key, fleet_rolling(deployments()))
    if turn.granted:
        manifest["metadata"].setdefault("annotations", {})[FLEET_ROLLOUT_ANNOTATION] = now
        return None
    hold(manifest, live)
    return turn


def _annotations(obj: Obj) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})
