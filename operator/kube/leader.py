"""Leader election on a coordination.k8s.io Lease: of the operator's replicas only the leader reconciles.

The same protocol as client-go's leaderelection (what kube-controller-manager and controller-runtime
operators use), so `kubectl get lease` reads the same way: the Lease's holderIdentity is the leader,
renewTime its last renewal, leaseDurationSeconds how long the others wait after the last renewal they saw.

- A candidate takes the Lease when it is free (no holder, or released) or when its holder has not renewed
  it for `lease_duration` seconds *as this candidate observed* (the time it last saw the Lease change, on its
  own monotonic clock, never the holder's timestamps: clocks of two nodes may differ).
- Every write names the resourceVersion it read, so two candidates cannot both take it: one gets 409.
- The leader renews every `retry_period` seconds. When it could not renew for `renew_deadline` seconds
  (shorter than the lease duration) it has lost: the process must stop writing at once, before another
  replica may take over. The operator then exits (main.py), and its container restarts as a candidate.
- The fence: `holds_lease()` is computed, on each call, from the monotonic time the last successful acquire
  or renew *began* (the API server wrote the Lease no earlier, so no standby can have seen that renewal
  before it) and the renew deadline: it turns False by itself when renewals stop, whatever stops them (the
  event loop stalled, the process paused, the API server unreachable), without any code having to run.
  Every pass and every write of the reconciler asks it first (kube.py `Kube.check_leader`); the margin
  from the renew deadline to the lease duration (5 s by default) covers a write checked just before it.
- On a clean shutdown the leader releases the Lease (no holder, a 1 s duration), so that a standby takes
  over within its retry period instead of the lease duration.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pagoda.operator.kube.client import Kube, KubeError

log = logging.getLogger("pagoda.operator.leader")
Obj = dict[str, Any]


@dataclass(frozen=True)
class Timing:
    """client-go's defaults."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(f"want 0 < retry_period < renew_deadline < lease_duration, got {self}")


def _micro_time() -> str:
    """Now as a Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease `namespace/name`; its calls block (run them in a thread)."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing = Timing(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.timing, self._clock = timing, clock
        self._observed: tuple[str, float] | None = None  # (the Lease's resourceVersion, when first seen)
        # When our last successful acquire or renew began (monotonic); None: not leading (or released).
        self.renewed_at: float | None = None

    def holds_lease(self) -> bool:
        """Whether this replica may still write, now: less than the renew deadline since its last successful
        renewal began (monotonic clock). The fence; callable from any thread."""
        renewed_at = self.renewed_at
        return renewed_at is not None and self._clock() - renewed_at < self.timing.renew_deadline

    def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease after it."""
        started = self._clock()
        try:
            lease = self.kube.get("coordination.k8s.io/v1", "leases", self.namespace, self.name)
            if lease is None:
                self.kube.create(self._lease({}, transitions=0), "leases", counted=False)
                return self._won(started, new=True)
            spec = lease.get("spec") or {}
            holder = spec.get("holderIdentity") or ""
            version = str(lease["metadata"]["resourceVersion"])
            now = self._clock()
            if self._observed is None or self._observed[0] != version:
                self._observed = (version, now)
            if holder and holder != self.identity:
                duration = float(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
                if now - self._observed[1] < duration:
                    return False  # held, and renewed within its duration as far as we have seen
            renewing = holder == self.identity
            transitions = int(spec.get("leaseTransitions") or 0) + (0 if renewing else 1)
            acquired = spec.get("acquireTime") if renewing else None
            self.kube.replace(self._lease(lease, transitions, acquired), "leases")
            return self._won(started, new=not renewing)
        except KubeError as exc:
            if exc.status != 409:  # 409: another candidate wrote first; not an error
                log.warning(
                    "Failed to acquire or renew lease=%s/%s error=%r", self.namespace, self.name, str(exc)
                )
            return False
        except OSError as exc:  # the API server did not answer
            log.warning(
                "Failed to reach the API server for lease=%s/%s error=%r", self.namespace, self.name, str(exc)
            )
            return False

    def release(self) -> None:
        """Gives the Lease up (a clean shutdown): a standby takes it at its next try."""
        if self.renewed_at is None:
            return
        self.renewed_at = None  # the fence closes before the Lease is given away
        try:
            lease = self.kube.get("coordination.k8s.io/v1", "leases", self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._lease(lease, int((lease.get("spec") or {}).get("leaseTransitions") or 0))
            body["spec"].update(holderIdentity="", leaseDurationSeconds=1)
            self.kube.replace(body, "leases")
            log.info("Released lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
        except (KubeError, OSError) as exc:
            log.warning("Failed to release lease=%s/%s error=%r", self.namespace, self.name, str(exc))

    def _won(self, started: float, new: bool) -> bool:
        # From when the attempt began, not when its answer came: the Lease was written in between, so a
        # standby counts its lease duration from no earlier than `started`.
        self.renewed_at = started
        if new:
            log.info("Acquired lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
        return True

    def _lease(self, current: Obj, transitions: int, acquired: object = None) -> Obj:
        now = _micro_time()
        metadata: Obj = {"name": self.name, "namespace": self.namespace}
        version = (current.get("metadata") or {}).get("resourceVersion")
        if version:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.timing.lease_duration),
                "acquireTime": acquired or now,
                "renewTime": now,
                "leaseTransitions": transitions,
            },
        }
