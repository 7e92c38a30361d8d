"""Pure functions: how a fixed pool of GPUs is shared by the services of one GPUBudget (docs/budget.md,
docs/design/2026-12-06-gpu-budget.md); reconcile/gpubudget.py applies the result as each member's
ScaledObject maxReplicaCount.

Each step a pure function of what the pass reads:

- `allocate`: each member's **target**, the replicas it may hold. First its guarantee (its autoscaling
  minReplicas, which the budget must cover: `problems`), then what is left, one replica at a time, by priority
  (higher first) to members whose autoscaler asks for more (the HPA's desired count, up to their maxReplicas);
  among equal priorities the next replica goes to the member with the fewest GPUs above its guarantee (then by
  name), so equals share the slack evenly, counted in GPUs. Work-conserving: GPUs no higher priority can use
  (its demand met, or its replicas too large for what is left) go to lower ones.
- `remember`: a member's demand as the allocation reads it, held like its HPA holds a scale-in: a rise
  counts at once, a fall only once it has lasted the member's scale-down window (its cooldownPeriod, which
  is also its HPA's scale-down stabilization window). Read raw, a busy member's demand dips for a moment
  whenever its metric does (e.g. its queue drains between two polls); each dip would hand its GPU back to a
  lower member and take it again a poll later, a flap in which a replica starts that the budget then takes
  back.
- `hand_over`: each member's **limit** now, the maxReplicaCount to apply. A target below what a member holds
  applies at once: its HPA scales it in through the normal drain (requests finish, its PodDisruptionBudget is
  honoured). A target above it is granted only into GPUs that are free now, highest priority first: held by
  no member's pod (a terminating one included) and promised to no member's autoscaler (`committed`: a
  lowered maxReplicaCount frees nothing until KEDA's HPA and the Deployment have taken it, or the member
  could still scale up into the GPU it is handing over). So the other member's scale-in comes first, and the
  scheduler never has to preempt anything. A member's limit is never below its guarantee (KEDA needs
  maxReplicaCount >= minReplicaCount), nor below 1.

No I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .scaling import trigger_values

Key = tuple[str, str]  # (namespace, name) of an InferenceService
Obj = dict[str, Any]
Reading = tuple[float, int]  # (when, replicas asked for) of one member's demand
# kube-controller-manager's --horizontal-pod-autoscaler-tolerance (its default): the HPA leaves the replicas
# as they are while a metric's ratio to its target is within 10% of 1.
HPA_TOLERANCE = Decimal("0.1")


@dataclass(frozen=True)
class Member:
    """One service of a budget, as the pass reads it."""

    key: Key
    priority: int
    gpus: int  # GPUs per replica (spec.resources.gpu.count)
    guaranteed: int  # replicas it always may hold (spec.autoscaling.minReplicas)
    ceiling: int  # the most it ever may hold (spec.autoscaling.maxReplicas)
    demand: int  # replicas its autoscaler asks for (the HPA's desiredReplicas, held by `remember`)
    holding: int = 0  # replicas whose pods hold GPUs now (Running or Pending, terminating included)
    # Replicas its autoscaler may already scale to: the most of its ScaledObject's maxReplicaCount as applied,
    # KEDA's HPA's maxReplicas and the Deployment's replicas (0: none of them exists yet).
    committed: int = 0

    @property
    def reserved(self) -> int:
        """Replicas whose GPUs are this member's until it scales in: held, or promised to its autoscaler."""
        return max(self.holding, self.committed)


def problems(capacity: int, members: list[Member]) -> list[str]:
    """Why the budget cannot be honoured as declared, each naming what to change; [] when it can."""
    if capacity < 0:
        return [f"spec.gpus: {capacity} is negative"]
    found = []
    needed = sum(m.guaranteed * m.gpus for m in members)
    if needed > capacity:
        each = ", ".join(f"{m.key[0]}/{m.key[1]} {m.guaranteed} x {m.gpus}" for m in members if m.guaranteed)
        found.append(
            f"spec.gpus: {capacity} GPUs cannot cover the members' guaranteed replicas (their "
            f"autoscaling.minReplicas), which need {needed} ({each})"
        )
    for m in members:
        if m.gpus > capacity:
            found.append(
                f"{m.key[0]}/{m.key[1]}: one replica needs {m.gpus} GPUs (spec.resources.gpu.count), more "
                f"than the budget's {capacity}"
            )
    return found


def allocate(capacity: int, members: list[Member]) -> dict[Key, int]:
    """Each member's target replicas (see the module's docstring). With `problems`, the guarantees are
    still given in priority order as far as the GPUs go (the status reports the rest)."""
    target = {m.key: 0 for m in members}
    free = capacity
    by_priority = sorted(members, key=lambda m: (-m.priority, m.key))
    for m in by_priority:  # the guarantees first
        give = min(m.guaranteed, m.ceiling, max(0, free) // m.gpus if m.gpus else m.guaranteed)
        target[m.key] = give
        free -= give * m.gpus
    for priority in sorted({m.priority for m in members}, reverse=True):
        level = [m for m in members if m.priority == priority]
        while True:
            wanting = [
                m for m in level if target[m.key] < min(m.demand, m.ceiling) and m.gpus <= free and m.gpus > 0
            ]
            if not wanting:
                break
            m = min(wanting, key=lambda m: ((target[m.key] - m.guaranteed) * m.gpus, m.key))
            target[m.key] += 1
            free -= m.gpus
    return target


def hand_over(capacity: int, members: list[Member], target: dict[Key, int]) -> dict[Key, int]:
    """Each member's maxReplicaCount now, on the way to `target` (see the module's docstring)."""
    limit: dict[Key, int] = {}
    free = capacity - sum(m.reserved * m.gpus for m in members)
    for m in sorted(members, key=lambda m: (-m.priority, m.key)):
        want = target[m.key]
        if want <= m.reserved:
            limit[m.key] = want  # scale in (or hold): the HPA drains what is over; freed once it has
            continue
        room = max(0, free) // m.gpus if m.gpus else want - m.reserved
        grant = min(want - m.reserved, room)
        free -= grant * m.gpus
        limit[m.key] = m.reserved + grant
    return {m.key: max(limit[m.key], m.guaranteed, 1) for m in members}


def shortfall(
    budget: str, capacity: int, members: list[Member], target: dict[Key, int], key: Key
) -> str | None:
    """Why member `key` gets fewer replicas than its autoscaler asks for (up to its maxReplicas), for its
    status; None when it gets them all. E.g. "budget team-gpus is full (4 of 4 GPUs): ns/chat (priority 100)
    holds 3; this service gets 1 of the 3 replicas it asks for"."""
    me = next(m for m in members if m.key == key)
    asked = min(me.demand, me.ceiling)
    if target[key] >= asked:
        return None
    used = sum(target[m.key] * m.gpus for m in members)
    others = sorted(
        (m for m in members if m.key != key and target[m.key]), key=lambda m: (-m.priority, m.key)
    )
    holders = "; ".join(
        f"{m.key[0]}/{m.key[1]} (priority {m.priority}) holds {target[m.key] * m.gpus}" for m in others
    )
    why = f"budget {budget} is full ({used} of {capacity} GPUs)"
    if capacity - used > 0:
        why = (
            f"budget {budget} has {capacity - used} of {capacity} GPUs left, fewer than one replica's "
            f"{me.gpus}"
        )
    return (
        f"{why}: {holders or 'no other member holds any'}; this service gets {target[key]} of the {asked} "
        "replicas it asks for"
    )


def demand(hpa: Obj | None, guaranteed: int) -> int:
    """The replicas a member's autoscaler asks for, from KEDA's HPA: its desiredReplicas, which the HPA
    caps at maxReplicaCount; while the cap holds it back (condition ScalingLimited, reason TooManyReplicas)
    what its metrics ask for, as the HPA computes it (the current replicas times each metric's ratio to its
    target, rounded up, the largest). No HPA yet: the guarantee."""
    if hpa is None:
        return guaranteed
    status = hpa.get("status") or {}
    asked = int(status.get("desiredReplicas") or 0)
    limited = any(
        c.get("type") == "ScalingLimited"
        and c.get("status") == "True"
        and c.get("reason") == "TooManyReplicas"
        for c in status.get("conditions") or []
    )
    if limited:
        current = int(status.get("currentReplicas") or 0)
        ratios = [value.ratio() for value in trigger_values(hpa, None)]
        asked = max([asked, *(_scaled(current, ratio) for ratio in ratios)])
    return max(asked, guaranteed)


def _scaled(current: int, ratio: Decimal) -> int:
    """The replicas the HPA asks for from one metric: none changed within its tolerance."""
    return current if abs(ratio - 1) <= HPA_TOLERANCE else math.ceil(current * ratio)


def remember(readings: Sequence[Reading], now: float, asked: int, window: float) -> tuple[Reading, ...]:
    """A member's demand readings after reading `asked` at `now` (see the module's docstring): those of the
    last `window` seconds that no later one reaches, oldest first, so the first is the most it asked for in
    the window, which is the demand the allocation uses."""
    kept = [(when, value) for when, value in readings if now - when < window and value > asked]
    return (*kept, (now, asked))
