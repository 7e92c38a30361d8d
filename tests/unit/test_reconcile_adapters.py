"""spec.lora's adapters kept in step in each Ready runtime pod (kube/adapters.py), against an in-process
fake of the runtime's adapters API (docs/lora.md; the real one is exercised by the runtime tier and
e2e/test_lora.py)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fakekube import StampingWrites, owner_object

from pagoda import contract
from pagoda.contract import management
from pagoda.operator.api import InferenceServiceSpec
from pagoda.operator.kube.adapters import AdapterSync, failure_events
from pagoda.operator.kube.cache import ObjectCache
from pagoda.operator.kube.client import KubeError
from pagoda.operator.reconcile import core

Obj = dict[str, Any]
SIGNER = management.Signer(management.new_private_key())  # the operator's key


@pytest.fixture(autouse=True, scope="module")
def _pods_public_key(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The pods' copy of the operator's public key (resources/management.py)."""
    FakeAdapterRuntimes.key_file = tmp_path_factory.mktemp("management") / "public-key.pem"
    FakeAdapterRuntimes.key_file.write_text(SIGNER.public_pem)


class FakeAdapterRuntimes:
    """A fake of the runtime's /v1/pagoda/adapters, per pod IP, with the documented behaviour: idempotent PUT,
    replacement on a new source, DELETE answers the Unloaded entry, 422/409 errors with a stable `type`.
    `ranks` maps a source to its adapter's rank (an unknown source is AdapterSourceNotFound)."""

    key_file: Path

    def __init__(self, ips: list[str], ranks: Obj, max_rank: int = 16, max_adapters: int = 4) -> None:
        self.pods: dict[str, dict[str, Obj]] = {ip: {} for ip in ips}
        self.ranks, self.max_rank, self.max_adapters = ranks, max_rank, max_adapters
        self.unreachable: set[str] = set()
        self.slow: set[str] = set()  # PUT/DELETE time out (the work goes on)
        # Each pod's runtime checks the operator's signature as the real one does, as the pod it is (UIDS).
        self.verifiers: dict[str, management.Verifier] = {}  # "<ip>/<uid>" -> its runtime's check
        self.calls: list[tuple[str, str, str]] = []  # (method, ip, name or "")

    def __call__(
        self, method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float
    ) -> tuple[int, Obj]:
        ip, path = url.split("//", 1)[1].split(":", 1)[0], url.split("/v1/pagoda/adapters", 1)[1]
        name = path.lstrip("/")
        self.calls.append((method, ip, name))
        if ip in self.unreachable:
            raise OSError("[Errno 113] No route to host")
        parts = urlsplit(url)
        uid = UIDS.get(ip, "")
        if f"{ip}/{uid}" not in self.verifiers:
            env = {contract.POD_UID_ENV: uid, contract.POD_IP_ENV: ip}
            identity = management.PodIdentity.from_env(env, "0.0.0.0", parts.port or 0)
            self.verifiers[f"{ip}/{uid}"] = management.Verifier(self.key_file, identity)
        try:
            self.verifiers[f"{ip}/{uid}"].check(
                method, parts.netloc, parts.path, data or b"", headers.get("authorization")
            )
        except management.Unauthorized as exc:
            return 401, _err(f"Unauthorized: {exc}", "Unauthorized")
        body = json.loads(data) if data else None
        adapters = self.pods[ip]
        if method == "GET":
            return 200, {
                "enabled": True,
                "maxAdapters": self.max_adapters,
                "adapters": list(adapters.values()),
            }
        if method == "DELETE":
            if name not in adapters:
                return 404, _err(f"adapter {name} is not loaded", "AdapterNotFound")
            entry = adapters.pop(name)
            if ip in self.slow:
                raise TimeoutError("timed out")
            return 200, {**entry, "state": "Unloaded"}
        assert method == "PUT" and body is not None
        source = body["source"]
        current = adapters.get(name)
        if current and current["source"] == source and current["state"] == "Loaded":
            return 200, current
        if name not in adapters and len(adapters) >= self.max_adapters:
            return 409, _err(
                f"adapter {name} ({source}): {self.max_adapters} adapters loaded", "TooManyAdapters"
            )
        if source not in self.ranks:
            return self._failed(adapters, name, source, "AdapterSourceNotFound", "does not exist")
        if self.ranks[source] > self.max_rank:
            detail = (
                f"rank {self.ranks[source]} is above this server's maximum {self.max_rank} (--max-lora-rank)"
            )
            return self._failed(adapters, name, source, "AdapterRankTooLarge", detail)
        adapters[name] = {"name": name, "source": source, "state": "Loaded", "rank": self.ranks[source]}
        if ip in self.slow:
            raise TimeoutError("timed out")
        return 200, adapters[name]

    @staticmethod
    def _failed(adapters: dict[str, Obj], name: str, source: str, kind: str, detail: str) -> tuple[int, Obj]:
        message = f"adapter {name} ({source}): {detail}"
        adapters[name] = {"name": name, "source": source, "state": "Failed", "reason": kind, "error": message}
        return 422, _err(message, kind)

    def loaded(self, ip: str) -> dict[str, str]:
        return {n: e["source"] for n, e in self.pods[ip].items() if e["state"] == "Loaded"}


def _err(message: str, kind: str) -> Obj:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


# What each pod's downward API tells its runtime: pod IP -> the pod's UID (set by pod()).
UIDS: dict[str, str] = {}


def pod(uid: str, ip: str, ready: bool = True, restarts: int = 0) -> Obj:
    UIDS[ip] = uid
    status: Obj = {
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        "containerStatuses": [{"name": "runtime", "restartCount": restarts}],
    }
    return {"metadata": {"uid": uid}, "status": status}


def spec_of(obj: Obj) -> InferenceServiceSpec:
    """The owner's spec as the reconcile passes it to AdapterSync.sync (parsed once per pass)."""
    return InferenceServiceSpec.model_validate(obj["spec"])


def owner(adapters: dict[str, str] | None, api_key: bool = False) -> Obj:
    spec: Obj = {
        "model": {"uri": "file:///models/tiny", "servedName": "tiny"},
        "resources": {"gpu": {"count": 1}},
    }
    if adapters is not None:
        spec["lora"] = {
            "maxLoras": 2,
            "maxCpuLoras": 4,
            "adapters": [{"name": n, "uri": u} for n, u in adapters.items()],
        }
    if api_key:
        spec["runtime"] = {"apiKeySecret": {"name": "runtime-key"}}
    return {"metadata": {"name": "tiny", "namespace": "ns", "uid": "o1"}, "spec": spec}


IPS = ["10.244.0.2", "10.244.0.3"]
NOW = "2026-12-01T00:00:00Z"
SQL, CHAT = "file:///models/adapters/sql", "file:///models/adapters/chat"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_every_ready_pod_gets_the_spec_adapters_and_the_status_counts_them() -> None:
    runtimes = FakeAdapterRuntimes(IPS, {SQL: 8, CHAT: 8})
    sync = AdapterSync(SIGNER, runtimes)
    pods = [pod("a", IPS[0]), pod("b", IPS[1]), pod("c", "10.244.0.4", ready=False)]
    report = sync.sync(spec_of(owner({"sql": SQL, "chat": CHAT})), pods)
    assert report is not None
    assert report.status == {
        "adapters": [
            {"name": "sql", "readyReplicas": 2, "replicas": 2, "state": "Ready"},
            {"name": "chat", "readyReplicas": 2, "replicas": 2, "state": "Ready"},
        ],
        "adaptersReady": "2/2",
    }
    assert report.requeue_after is None
    assert runtimes.loaded(IPS[0]) == runtimes.loaded(IPS[1]) == {"sql": SQL, "chat": CHAT}
    assert not any(ip == "10.244.0.4" for _m, ip, _n in runtimes.calls)  # not Ready: not asked


def test_a_pod_in_step_is_not_asked_again_until_the_recheck() -> None:
    runtimes, clock = FakeAdapterRuntimes(IPS, {SQL: 8}), Clock()
    sync = AdapterSync(SIGNER, runtimes, recheck_after=600.0, clock=clock)
    pods = [pod("a", IPS[0]), pod("b", IPS[1])]
    sync.sync(spec_of(owner({"sql": SQL})), pods)
    asked = len(runtimes.calls)
    clock.now += 300
    assert sync.sync(spec_of(owner({"sql": SQL})), pods).status["adaptersReady"] == "1/1"
    assert len(runtimes.calls) == asked
    clock.now += 301
    sync.sync(spec_of(owner({"sql": SQL})), pods)
    assert [m for m, _ip, _n in runtimes.calls[asked:]] == ["GET", "GET"]  # a look, nothing to change


def test_a_runtime_restarted_in_place_gets_the_adapters_again() -> None:
    runtimes = FakeAdapterRuntimes(IPS[:1], {SQL: 8})
    sync = AdapterSync(SIGNER, runtimes)
    sync.sync(spec_of(owner({"sql": SQL})), [pod("a", IPS[0])])
    runtimes.pods[IPS[0]].clear()  # the container restarted: nothing loaded at run time survives
    sync.sync(spec_of(owner({"sql": SQL})), [pod("a", IPS[0], restarts=1)])
    assert runtimes.loaded(IPS[0]) == {"sql": SQL}


def test_removed_adapters_are_unloaded_and_changed_ones_replaced() -> None:
    runtimes, clock = (
        FakeAdapterRuntimes(IPS, {SQL: 8, CHAT: 8, "file:///models/adapters/sql-v2": 8}),
        Clock(),
    )
    sync = AdapterSync(SIGNER, runtimes, clock=clock)
    pods = [pod("a", IPS[0]), pod("b", IPS[1])]
    sync.sync(spec_of(owner({"sql": SQL, "chat": CHAT})), pods)
    clock.now += 1
    report = sync.sync(spec_of(owner({"sql": "file:///models/adapters/sql-v2"})), pods)
    assert report is not None and report.status["adaptersReady"] == "1/1"
    for ip in IPS:
        assert runtimes.loaded(ip) == {"sql": "file:///models/adapters/sql-v2"}
        assert ("DELETE", ip, "chat") in runtimes.calls


def test_a_failed_load_is_reported_with_the_runtime_reason_once_and_retried_later() -> None:
    runtimes, clock = FakeAdapterRuntimes(IPS, {SQL: 8, CHAT: 64}), Clock()
    sync = AdapterSync(SIGNER, runtimes, failed_retry_after=300.0, clock=clock)
    pods = [pod("a", IPS[0]), pod("b", IPS[1])]
    report = sync.sync(spec_of(owner({"sql": SQL, "chat": CHAT})), pods)
    assert report is not None
    chat = report.status["adapters"][1]
    assert chat["state"] == "Failed" and chat["reason"] == "AdapterRankTooLarge"
    assert chat["readyReplicas"] == 0 and "rank 64 is above" in chat["message"]
    assert report.status["adaptersReady"] == "1/2"
    assert report.requeue_after == 300.0
    assert failure_events({}, report.status) == [
        ("AdapterFailed", f"Adapter chat: AdapterRankTooLarge: {chat['message']}")
    ]
    assert failure_events(report.status, report.status) == []  # once per reason change
    puts = runtimes.calls.count(("PUT", IPS[0], "chat"))
    clock.now += 10
    again = sync.sync(spec_of(owner({"sql": SQL, "chat": CHAT})), pods)
    assert again is not None and again.status == report.status  # a stable status: nothing to write
    assert runtimes.calls.count(("PUT", IPS[0], "chat")) == puts
    clock.now += 300
    sync.sync(spec_of(owner({"sql": SQL, "chat": CHAT})), pods)
    assert runtimes.calls.count(("PUT", IPS[0], "chat")) == puts + 1


def test_an_unreachable_pod_is_retried_with_back_off_and_named_in_the_status() -> None:
    runtimes, clock = FakeAdapterRuntimes(IPS, {SQL: 8}), Clock()
    runtimes.unreachable.add(IPS[1])
    sync = AdapterSync(SIGNER, runtimes, retry_after=10.0, max_retry_after=40.0, clock=clock)
    pods = [pod("a", IPS[0]), pod("b", IPS[1])]
    report = sync.sync(spec_of(owner({"sql": SQL})), pods)
    assert report is not None
    assert report.status["adapters"] == [
        {
            "name": "sql",
            "readyReplicas": 1,
            "replicas": 2,
            "state": "Loading",
            "reason": "ReplicaUnreachable",
            "message": "GET /v1/pagoda/adapters: [Errno 113] No route to host",
        }
    ]
    assert report.requeue_after == 10.0
    gets = [c for c in runtimes.calls if c[1] == IPS[1]]
    clock.now += 5
    sync.sync(spec_of(owner({"sql": SQL})), pods)
    assert [c for c in runtimes.calls if c[1] == IPS[1]] == gets  # backing off
    for wait in (10.0, 20.0, 40.0, 40.0):
        clock.now += wait
        report = sync.sync(spec_of(owner({"sql": SQL})), pods)
        assert report is not None and report.requeue_after == min(2 * wait, 40.0)
    runtimes.unreachable.clear()
    clock.now += 40
    report = sync.sync(spec_of(owner({"sql": SQL})), pods)
    assert report is not None and report.status["adaptersReady"] == "1/1" and report.requeue_after is None


def test_a_pass_asks_a_bounded_number_of_pods() -> None:
    ips = [f"10.244.0.{i}" for i in range(2, 12)]
    runtimes, clock = FakeAdapterRuntimes(ips, {SQL: 8}), Clock()
    sync = AdapterSync(SIGNER, runtimes, per_pass=3, clock=clock)
    pods = [pod(str(i), ip) for i, ip in enumerate(ips)]
    report = sync.sync(spec_of(owner({"sql": SQL})), pods)
    assert report is not None
    assert len({ip for _m, ip, _n in runtimes.calls}) == 3
    assert (
        report.status["adapters"][0]["readyReplicas"] == 3 and report.status["adapters"][0]["replicas"] == 10
    )
    assert report.requeue_after is not None and report.requeue_after <= 10.0
    for _ in range(3):
        clock.now += report.requeue_after or 0
        report = sync.sync(spec_of(owner({"sql": SQL})), pods)
        assert report is not None
    assert report.status["adaptersReady"] == "1/1"


def test_a_pass_brings_its_pods_in_step_at_once() -> None:
    """The pods of one pass are synced together (a pass waits for the slowest pod, not for the sum): each
    pod's first call waits at a barrier that opens only when all four pods are being asked."""
    ips = [f"10.244.0.{i}" for i in range(2, 6)]
    runtimes = FakeAdapterRuntimes(ips, {SQL: 8})
    barrier = threading.Barrier(len(ips), timeout=10)

    def request(method: str, url: str, data: bytes | None, headers: dict[str, str], timeout: float) -> Any:
        if method == "GET":
            barrier.wait()  # BrokenBarrierError (the pod unreachable) unless the four pods overlap
        return runtimes(method, url, data, headers, timeout)

    sync = AdapterSync(SIGNER, request, per_pass=len(ips))
    report = sync.sync(spec_of(owner({"sql": SQL})), [pod(str(i), ip) for i, ip in enumerate(ips)])
    assert report.status["adaptersReady"] == "1/1"
    assert report.status["adapters"][0]["readyReplicas"] == 4
    assert all(runtimes.loaded(ip) == {"sql": SQL} for ip in ips)


def test_a_load_that_times_out_counts_as_loading_and_is_looked_at_again() -> None:
    runtimes, clock = FakeAdapterRuntimes(IPS[:1], {SQL: 8}), Clock()
    runtimes.slow.add(IPS[0])
    sync = AdapterSync(SIGNER, runtimes, clock=clock)
    report = sync.sync(spec_of(owner({"sql": SQL})), [pod("a", IPS[0])])
    assert report is not None and report.status["adapters"][0]["state"] == "Loading"
    assert report.requeue_after == 5.0
    clock.now += 5
    report = sync.sync(spec_of(owner({"sql": SQL})), [pod("a", IPS[0])])
    assert report is not None and report.status["adapters"][0]["state"] == "Ready"
    assert runtimes.calls.count(("PUT", IPS[0], "sql")) == 1


def test_no_ready_replica_and_no_lora() -> None:
    sync = AdapterSync(SIGNER, FakeAdapterRuntimes([], {}))
    report = sync.sync(spec_of(owner({"sql": SQL})), [])
    assert report is not None
    assert report.status == {
        "adapters": [
            {
                "name": "sql",
                "readyReplicas": 0,
                "replicas": 0,
                "state": "Loading",
                "reason": "NoReadyReplicas",
                "message": "No replica is Ready to load it into",
            }
        ],
        "adaptersReady": "0/1",
    }
    assert sync.sync(spec_of(owner(None)), []).status == {}


def test_calls_are_signed_with_the_operators_key_and_need_no_api_key() -> None:
    runtimes = FakeAdapterRuntimes(IPS[:1], {SQL: 8})
    # spec.runtime.apiKeySecret guards the inference API only: no Secret is read to load adapters.
    report = AdapterSync(SIGNER, runtimes).sync(
        spec_of(owner({"sql": SQL}, api_key=True)), [pod("a", IPS[0])]
    )
    assert report.status["adaptersReady"] == "1/1"


def test_a_pod_that_refuses_the_signature_is_reported_unauthorized() -> None:
    runtimes = FakeAdapterRuntimes(IPS[:1], {SQL: 8})
    stranger = management.Signer(management.new_private_key())  # not the key the pods hold
    report = AdapterSync(stranger, runtimes).sync(spec_of(owner({"sql": SQL})), [pod("a", IPS[0])])
    entry = report.status["adapters"][0]
    assert (entry["state"], entry["reason"]) == ("Loading", "Unauthorized")
    assert "does not verify with the operator's public key" in entry["message"]
    assert runtimes.loaded(IPS[0]) == {} and runtimes.calls == [("GET", IPS[0], "")]


def test_each_call_is_signed_for_the_pod_it_goes_to() -> None:
    """The operator signs for the pod's UID and its IP: a pod that is not the one the operator meant (a new
    pod at an IP the operator still knows as another's) refuses the call, and the status says why."""
    runtimes = FakeAdapterRuntimes(IPS[:1], {SQL: 8})
    meant = pod("a", IPS[0])
    UIDS[IPS[0]] = "z"  # the runtime at that IP is pod z
    report = AdapterSync(SIGNER, runtimes).sync(spec_of(owner({"sql": SQL})), [meant])
    entry = report.status["adapters"][0]
    assert (entry["state"], entry["reason"]) == ("Loading", "Unauthorized")
    assert "signed for pod 'a', and this is pod 'z'" in entry["message"]
    assert runtimes.loaded(IPS[0]) == {}
    report = AdapterSync(SIGNER, runtimes).sync(spec_of(owner({"sql": SQL})), [pod("z", IPS[0])])
    assert report.status["adaptersReady"] == "1/1" and runtimes.loaded(IPS[0]) == {"sql": SQL}


def test_the_status_fits_the_crd() -> None:
    from pagoda.operator.api import InferenceServiceStatus

    runtimes = FakeAdapterRuntimes(IPS, {SQL: 8, CHAT: 512})
    report = AdapterSync(SIGNER, runtimes).sync(
        spec_of(owner({"sql": SQL, "chat": CHAT})), [pod("a", IPS[0])]
    )
    assert report is not None
    InferenceServiceStatus.model_validate(json.loads(json.dumps(report.status)))


class RecordingKube(StampingWrites):
    """Answers a pass's writes as the API server does (the object back, with a new resourceVersion)."""

    def __init__(self, owner: Obj) -> None:
        super().__init__()
        self.owner = owner
        self.status: Obj = {}

    def apply(self, manifest: Obj, plural: str) -> Obj:
        self.writes.append(("apply", manifest["kind"]))
        return self._stamp(manifest)

    def create(self, manifest: Obj, plural: str) -> Obj:
        self.writes.append(("create", manifest["kind"]))
        return manifest

    def patch_status(
        self, api_version: str, kind: str, plural: str, namespace: str, name: str, status: Obj
    ) -> Obj:
        self.writes.append(("patch_status", kind))
        self.status = status
        return self._stamp({**self.owner, "status": status})

    def delete(self, *_: Any) -> None:
        raise AssertionError("nothing to delete")

    def get_metadata(self, *_: Any) -> Obj | None:
        raise KubeError(404, "NotFound", "not expected")


def test_adding_an_adapter_changes_no_child_only_the_status() -> None:
    """A pass with spec.lora: the adapters are loaded at run time, so a new adapter leaves the pod template
    (and every other child) alone; the status reports it, and is stable from pass to pass."""

    def unreachable(*_: Any) -> tuple[int, Obj]:
        raise OSError("No route to host")

    spec = {
        "model": {"uri": "hf://pagoda-test/tiny-llama"},
        "resources": {"gpu": {"count": 1}},
        "replicas": 1,
    }
    lora: Obj = {"maxLoras": 2, "adapters": [{"name": "sql", "uri": "hf://pagoda-test/sql-lora"}]}
    owner = owner_object({**spec, "lora": lora})
    kube, cache, sync = (
        RecordingKube(owner),
        ObjectCache("InferenceService"),
        AdapterSync(SIGNER, unreachable),
    )
    cache.observe(owner)

    def run() -> core.Outcome:
        return core.reconcile(kube, "ns", "llm", now=lambda: NOW, cache=cache, adapters=sync)  # type: ignore[arg-type]

    run()
    assert kube.status["adaptersReady"] == "0/1"
    assert kube.status["adapters"][0]["reason"] == "NoReadyReplicas"
    kube.writes.clear()
    assert run().result == "unchanged" and kube.writes == []
    lora2 = {**lora, "adapters": [*lora["adapters"], {"name": "chat", "uri": "hf://pagoda-test/chat-lora"}]}
    kube.owner = {
        **owner,
        "metadata": {**owner["metadata"], "generation": 2, "resourceVersion": "1000"},
        "spec": {**spec, "lora": lora2},
    }
    cache.observe({**kube.owner, "status": kube.status})
    assert run().result == "applied"
    assert kube.writes == [("patch_status", "InferenceService")]  # no child changed: nothing restarts
    assert kube.status["adaptersReady"] == "0/2"


def test_a_fresh_operator_puts_only_what_a_pod_lacks() -> None:
    """After an operator restart (no memory) a pod's Loaded adapter is left alone; its Failed one is tried
    again at once (the operator does not know when it failed)."""
    runtimes = FakeAdapterRuntimes(IPS[:1], {SQL: 8, CHAT: 8})
    runtimes.pods[IPS[0]] = {
        "sql": {"name": "sql", "source": SQL, "state": "Loaded"},
        "chat": {
            "name": "chat",
            "source": CHAT,
            "state": "Failed",
            "reason": "AdapterDownloadFailed",
            "error": "x",
        },
    }
    report = AdapterSync(SIGNER, runtimes).sync(
        spec_of(owner({"sql": SQL, "chat": CHAT})), [pod("a", IPS[0])]
    )
    assert report is not None and report.status["adaptersReady"] == "2/2"
    assert runtimes.calls == [("GET", IPS[0], ""), ("PUT", IPS[0], "chat")]
