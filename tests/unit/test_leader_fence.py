"""The leader fence (operator/kube/leader.py, kube.py): a replica writes only while it may hold the
Lease, by its own monotonic clock, whether or not the event loop that renews the Lease (and would end the
process) still runs. No cluster: a fake clock and a stand-in for the API client."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from pagoda.operator.kube.client import Kube, NotLeader
from pagoda.operator.kube.leader import LeaderElector, Timing
from pagoda.operator.reconcile import core, events

Obj = dict[str, Any]
TIMING = Timing(lease_duration=15.0, renew_deadline=10.0, retry_period=2.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class LeaseServer:
    """The Lease's GET/POST/PUT as the API server answers them; each call takes `latency` seconds."""

    def __init__(self, clock: Clock, latency: float = 0.0) -> None:
        self.clock, self.latency = clock, latency
        self.lease: Obj | None = None
        self.version = 0

    def get(self, *_: Any) -> Obj | None:
        self.clock.now += self.latency
        return self.lease

    def _store(self, manifest: Obj) -> Obj:
        self.clock.now += self.latency
        self.version += 1
        self.lease = {**manifest, "metadata": {**manifest["metadata"], "resourceVersion": str(self.version)}}
        return self.lease

    def create(self, manifest: Obj, plural: str, counted: bool = True) -> Obj:
        return self._store(manifest)

    def replace(self, manifest: Obj, plural: str) -> Obj:
        return self._store(manifest)


def elector(clock: Clock, latency: float = 0.0) -> LeaderElector:
    server = LeaseServer(clock, latency)
    return LeaderElector(server, "ops", "pagoda", "a_1", TIMING, clock=clock)  # type: ignore[arg-type]


def test_the_fence_is_closed_until_the_lease_is_acquired() -> None:
    clock = Clock()
    candidate = elector(clock)
    assert not candidate.holds_lease()
    assert candidate.try_acquire_or_renew()
    assert candidate.holds_lease()


def test_the_fence_closes_by_itself_at_the_renew_deadline_when_renewals_stop() -> None:
    """A stalled event loop (or a paused process) renews nothing, and runs no code that could flip a
    flag: the fence still closes, on the clock alone, before a standby may take over."""
    clock = Clock()
    leader = elector(clock)
    assert leader.try_acquire_or_renew()
    clock.now += TIMING.renew_deadline - 0.001
    assert leader.holds_lease()
    clock.now += 0.001
    assert not leader.holds_lease()
    assert TIMING.renew_deadline < TIMING.lease_duration  # closed before any standby's wait ends


def test_each_renewal_reopens_the_fence_for_a_renew_deadline_from_when_it_began() -> None:
    """A slow renewal counts from when it began (the API server wrote the Lease no earlier, so a standby
    saw it no earlier), not from when its answer came back."""
    clock = Clock()
    leader = elector(clock, latency=1.5)  # a GET and a PUT: 3 s per renewal
    began = clock.now
    assert leader.try_acquire_or_renew()
    assert clock.now == began + 3.0
    assert leader.renewed_at == began
    clock.now = began + TIMING.renew_deadline
    assert not leader.holds_lease()
    clock.now = began + 8.0
    began = clock.now
    assert leader.try_acquire_or_renew()
    clock.now = began + TIMING.renew_deadline - 0.001
    assert leader.holds_lease()


def test_a_released_lease_closes_the_fence_before_it_is_given_away() -> None:
    clock = Clock()
    leader = elector(clock)
    assert leader.try_acquire_or_renew()
    seen: list[bool] = []
    server = leader.kube
    replace = server.replace

    def replace_seeing_the_fence(manifest: Obj, plural: str) -> Obj:
        seen.append(leader.holds_lease())
        return replace(manifest, plural)

    server.replace = replace_seeing_the_fence  # type: ignore[method-assign]
    leader.release()
    assert seen == [False]
    assert not leader.holds_lease()


def test_timing_must_leave_the_fence_a_margin() -> None:
    with pytest.raises(ValueError):
        Timing(lease_duration=10.0, renew_deadline=10.0, retry_period=2.0)


# --- the one choke point of every write ------------------------------------------------------------------


class FakeApi:
    """An ApiClient that records what reaches it; any call would be a write that went through."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def param_serialize(self, method: str, path: str, **_: Any) -> tuple[str, str]:
        self.calls.append(f"{method} {path}")
        raise AssertionError(f"a request reached the API server: {method} {path}")


OWNER: Obj = {
    "apiVersion": "pagoda.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llm", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
}
DEPLOYMENT: Obj = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "llm", "namespace": "ns"},
}


def lost_leader() -> tuple[Kube, FakeApi]:
    """A fenced Kube of a leader whose renewals stopped (its loop stalled) past the renew deadline."""
    clock = Clock()
    leader = elector(clock)
    assert leader.try_acquire_or_renew()
    clock.now += TIMING.renew_deadline + 1.0
    api = FakeApi()
    return Kube(api, fence=leader.holds_lease), api  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "write",
    [
        pytest.param(lambda kube: kube.apply(DEPLOYMENT, "deployments"), id="apply"),
        pytest.param(
            lambda kube: kube.delete("apps/v1", "Deployment", "deployments", "ns", "llm", "u2"), id="delete"
        ),
        pytest.param(
            lambda kube: kube.patch_status(
                "pagoda.dev/v1alpha1", "InferenceService", "inferenceservices", "ns", "llm", {"phase": "x"}
            ),
            id="patch_status",
        ),
        pytest.param(lambda kube: kube.create(DEPLOYMENT, "deployments"), id="create"),
        pytest.param(lambda kube: kube.replace(DEPLOYMENT, "deployments"), id="replace"),
        pytest.param(
            lambda kube: events.record(kube, OWNER, type_="Normal", reason="Updated", message="m", now="t"),
            id="event",
        ),
    ],
)
def test_every_write_of_a_leader_that_lost_the_lease_is_refused(
    write: Any, caplog: pytest.LogCaptureFixture
) -> None:
    kube, api = lost_leader()
    with caplog.at_level(logging.WARNING), pytest.raises(NotLeader):
        write(kube)
    assert api.calls == []
    assert "Skipped write" in caplog.text and "not leader" in caplog.text


def test_a_pass_of_a_leader_that_lost_the_lease_does_not_start(caplog: pytest.LogCaptureFixture) -> None:
    kube, api = lost_leader()
    with caplog.at_level(logging.WARNING), pytest.raises(NotLeader):
        core.reconcile(kube, "ns", "llm")
    assert api.calls == []  # not even a read: the pass never began
    assert "Skipped reconcile name=llm namespace=ns: not leader" in caplog.text


def test_a_write_is_refused_when_the_lease_is_lost_in_the_middle_of_a_pass() -> None:
    """The fence is asked at each write, not once per pass: a pass that outlives the Lease stops there."""
    answers = iter([True, False])
    kube = Kube(FakeApi(), fence=lambda: next(answers))  # type: ignore[arg-type]
    kube.check_leader("reconcile name=llm namespace=ns")
    with pytest.raises(NotLeader):
        kube.apply(DEPLOYMENT, "deployments")


def test_without_leader_election_every_write_goes_through() -> None:
    api = FakeApi()
    kube = Kube(api)  # type: ignore[arg-type]
    kube.check_leader("reconcile name=llm namespace=ns")
    with pytest.raises(AssertionError, match="reached the API server"):
        kube.apply(DEPLOYMENT, "deployments")
    assert api.calls == ["PATCH /apis/apps/v1/namespaces/ns/deployments/llm"]
