"""GitOps with a real Argo CD (v3.6.1, e2e/lab/argocd.py), with Argo CD's own status as the oracle.

A local Git repository holds what a platform team commits: the Helm chart (charts/pagoda) and a folder of
InferenceServices (examples/). The two Applications are the shipped examples/argocd files with their
repoURL pointed at that repository (and, for the chart's, the CPU runtime image and a 3 s resync), and
argocd-cm gets Pagoda's health check with the very patch docs/gitops.md gives users. The operator is the
chart's pod, from its image, under the chart's RBAC.

What is asserted, each on the Application's status as Argo CD writes it (`status.sync`, `status.health`,
`status.resources[]`, `status.operationState`, `status.reconciledAt`):
1. Both Applications sync, created together with the InferenceService CRD absent: the chart's CRD lands
   first (SkipDryRunOnMissingResource and the automated retry the docs name), nothing stays OutOfSync.
2. Health computed by Argo CD's Lua VM from the shipped script: Healthy once Ready, Degraded with the
   operator's message when the pods cannot be scheduled, Progressing while real runtime pods start.
3. No perpetual diff: across two refresh cycles after Healthy, and after the replica count changes the way
   the HPA changes it (the scale subresource), the Application stays Synced.
4. A commit that changes an engine setting syncs and rolls the Deployment, back to Healthy; removing a
   manifest prunes the InferenceService and the garbage collector removes its children; a hand edit of a
   synced InferenceService is reverted by self-heal.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fixtures import scratch
from e2e.lab import images
from e2e.lab.addons import install_keda_crds
from e2e.lab.argocd import EXAMPLES, NAMESPACE, RESYNC_SECONDS, ArgoCD, GitRepo, start_argocd
from e2e.lab.chartenv import CHART, CRD_NAME, ChartOperator, condition, kubectl_json
from e2e.lab.cluster import Cluster
from e2e.lab.processes import REPO_ROOT, wait_until
from e2e.lab.samples import tiny_sample
from e2e.lab.stack import Stack

pytestmark = pytest.mark.e2e

CHART_APP = "pagoda"
SERVICES_APP = "inference-services"
SYSTEM_NS = "pagoda-system"  # the chart Application's destination
SERVICES_NS = "ml-serving"  # the InferenceServices Application's destination
KIND = "InferenceService"


def service(name: str, *, real_pods: bool = False, autoscaled: bool = False) -> dict[str, Any]:
    """An InferenceService manifest as committed: no namespace (the Application's destination applies)."""
    obj = tiny_sample("x", name, real_pods=real_pods)
    obj["metadata"] = {"name": name}
    if autoscaled:
        obj["spec"].pop("replicas", None)
        obj["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 4}
        obj["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True}}
    return obj


def manifest(obj: dict[str, Any]) -> str:
    return yaml.safe_dump(obj, sort_keys=False)


def example_application(file: str, repo: GitRepo) -> dict[str, Any]:
    """The shipped example with its repoURL pointed at the local repository; the chart's operator runs the
    CPU runtime image (the real node's) and resyncs every 3 s, so that the tests need not wait for one."""
    app: dict[str, Any] = yaml.safe_load((EXAMPLES / file).read_text())
    app["spec"]["source"]["repoURL"] = repo.url
    helm_source = app["spec"]["source"].get("helm")
    if helm_source is not None and app["spec"]["source"]["path"] == "charts/pagoda":
        helm_source["valuesObject"]["operator"] = {
            "runtimeImage": images.runtime_cpu_image(),
            "extraArgs": ["--resync-seconds=3"],
        }
    return app


def resource(app: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    for res in (app.get("status") or {}).get("resources") or []:
        if res.get("kind") == kind and res.get("name") == name:
            found: dict[str, Any] = res
            return found
    return {}


def out_of_sync(app: dict[str, Any]) -> list[str]:
    return [
        f"{r.get('kind')}/{r.get('name')}"
        for r in (app.get("status") or {}).get("resources") or []
        if r.get("status") != "Synced"
    ]


def summary(app: dict[str, Any]) -> str:
    status = app.get("status") or {}
    return yaml.safe_dump(
        {
            "sync": status.get("sync"),
            "health": status.get("health"),
            "conditions": status.get("conditions"),
            "operationState": {
                k: (status.get("operationState") or {}).get(k) for k in ("phase", "message", "retryCount")
            },
            "resources": status.get("resources"),
        }
    )


class GitOps:
    def __init__(
        self, cluster: Cluster, argocd: ArgoCD, repo: GitRepo, operator: ChartOperator | None
    ) -> None:
        self.cluster, self.argocd, self.repo, self.operator = cluster, argocd, repo, operator

    def app(self, name: str = SERVICES_APP) -> dict[str, Any]:
        if self.operator is not None:
            self.operator.check_alive()
        return self.argocd.application(name)

    def live(self, kind: str, name: str, namespace: str = SERVICES_NS) -> dict[str, Any]:
        found: dict[str, Any] = kubectl_json(self.cluster, "get", kind, name, "-n", namespace)
        return found

    def exists(self, kind: str, name: str, namespace: str = SERVICES_NS) -> bool:
        out = self.cluster.kubectl("get", kind, name, "-n", namespace, "--ignore-not-found", "-o", "name")
        return bool(out.stdout.strip())

    def commit(self, files: dict[str, str | None], message: str) -> str:
        sha = self.repo.commit(files, message)
        self.argocd.refresh(SERVICES_APP)  # what Git's webhook does; polling finds it within RESYNC_SECONDS
        return sha

    def wait_app(
        self, what: str, check: Any, name: str = SERVICES_APP, timeout: float = 180
    ) -> dict[str, Any]:
        last: dict[str, Any] = {}

        def probe() -> dict[str, Any] | None:
            nonlocal last
            last = self.app(name)
            return last if check(last) else None

        try:
            return wait_until(probe, f"{name}: {what}", timeout=timeout, interval=1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{summary(last)}") from None

    def wait_synced_healthy(self, revision: str, timeout: float = 180) -> dict[str, Any]:
        def done(app: dict[str, Any]) -> bool:
            status = app.get("status") or {}
            return (
                status.get("sync", {}).get("revision") == revision
                and status.get("sync", {}).get("status") == "Synced"
                and status.get("health", {}).get("status") == "Healthy"
                and (status.get("operationState") or {}).get("phase") == "Succeeded"
                and (status.get("operationState") or {}).get("syncResult", {}).get("revision") == revision
            )

        return self.wait_app(f"Synced and Healthy at {revision[:8]}", done, timeout=timeout)


@pytest.fixture(scope="module")
def workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    with scratch(request, "pagoda-argocd-") as path:
        yield path


@pytest.fixture(scope="module")
def gitops(cluster: Cluster, workdir: Path) -> Iterator[GitOps]:
    # The chart installs the CRD through Argo CD: start without it, so the ordering is real.
    cluster.kubectl("delete", "crd", CRD_NAME, "--ignore-not-found", "--timeout=120s", timeout=150)
    install_keda_crds(
        cluster
    )  # the autoscaled service's ScaledObject (no KEDA runs: the test scales by hand)
    repo = GitRepo.create(workdir / "git" / "platform")
    repo.copy_tree(CHART, "charts/pagoda")
    repo.commit(
        {
            "examples/tiny.yaml": manifest(service("tiny")),
            "examples/tiny-auto.yaml": manifest(service("tiny-auto", autoscaled=True)),
        },
        "Pagoda chart and two InferenceServices",
    )
    argocd = start_argocd(cluster, workdir / "argocd")
    state = GitOps(cluster, argocd, repo, None)
    try:
        for file in ("application-chart.yaml", "application-inferenceservices.yaml"):
            argocd.apply_application(example_application(file, repo))
        yield state
    finally:
        for name in (SERVICES_APP, CHART_APP):  # their finalizers delete what they synced while Argo CD runs
            cluster.kubectl(
                "delete",
                "application",
                name,
                "-n",
                NAMESPACE,
                "--ignore-not-found",
                "--timeout=120s",
                check=False,
                timeout=150,
            )
        argocd.stop()
        for ns in (SERVICES_NS, SYSTEM_NS, NAMESPACE):
            cluster.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false", check=False)
        # Leave the CRD installed for the tests that come after.
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))


@pytest.fixture(scope="module")
def synced(gitops: GitOps, workdir: Path) -> GitOps:
    """Both Applications Synced; the operator running with the chart's ServiceAccount."""
    chart = gitops.wait_app(
        "Synced, its sync Succeeded",
        lambda a: (
            a.get("status", {}).get("sync", {}).get("status") == "Synced"
            and (a["status"].get("operationState") or {}).get("phase") == "Succeeded"
        ),
        name=CHART_APP,
        timeout=240,
    )
    assert not out_of_sync(chart), summary(chart)
    gitops.operator = ChartOperator(gitops.cluster, SYSTEM_NS).wait_ready()
    return gitops


def test_both_applications_sync_and_the_crd_lands_first(synced: GitOps) -> None:
    head = synced.repo.git("rev-parse", "HEAD")
    app = synced.wait_synced_healthy(head, timeout=240)
    assert not out_of_sync(app), summary(app)
    chart = synced.app(CHART_APP)
    assert chart["status"]["sync"]["revision"] == head
    assert resource(chart, "CustomResourceDefinition", CRD_NAME).get("status") == "Synced"
    crd = kubectl_json(synced.cluster, "get", "crd", CRD_NAME)
    for name in ("tiny", "tiny-auto"):
        res = resource(app, KIND, name)
        assert res.get("status") == "Synced", summary(app)
        live = synced.live("inferenceservice", name)
        assert live["metadata"]["creationTimestamp"] >= crd["metadata"]["creationTimestamp"]
        # Argo CD's own per-resource sync result for this revision, from its last operation. That may be a
        # partial one: right after a sync created both, Argo CD's cluster cache can lag the create, see one
        # missing, and self-heal only that one (seen in CI). A partial sync names its resources; the other
        # one's result went with the operation before, and its status is asserted Synced above.
        operation = app["status"]["operationState"]
        sync = (operation.get("operation") or {}).get("sync") or {}
        covered = {r["name"] for r in sync.get("resources") or []}
        if covered and name not in covered:
            continue
        results = operation["syncResult"]["resources"]
        (mine,) = [r for r in results if r["kind"] == KIND and r["name"] == name]
        assert mine["status"] == "Synced", mine


def test_health_is_argocds_from_the_shipped_lua_check(synced: GitOps) -> None:
    app = synced.wait_synced_healthy(synced.repo.git("rev-parse", "HEAD"))
    for name in ("tiny", "tiny-auto"):
        health = resource(app, KIND, name).get("health") or {}
        # Argo CD has no built-in check for pagoda.dev: a health at all comes from argocd-cm's script.
        assert health.get("status") == "Healthy", summary(app)
        ready = condition(synced.live("inferenceservice", name), "Ready")
        assert health.get("message") == ready["message"], (health, ready)
    assert app["status"]["health"]["status"] == "Healthy"


def test_degraded_with_the_operators_message(synced: GitOps) -> None:
    broken = service("tiny-nowhere")
    broken["spec"]["scheduling"] = {"nodeSelector": {"pagoda.dev/pool": "does-not-exist"}}
    synced.commit({"examples/tiny-nowhere.yaml": manifest(broken)}, "a service no node can run")

    def degraded(app: dict[str, Any]) -> bool:
        health = resource(app, KIND, "tiny-nowhere").get("health") or {}
        return bool(health.get("status") == "Degraded")

    app = synced.wait_app("tiny-nowhere Degraded", degraded)
    assert app["status"]["health"]["status"] == "Degraded"
    assert app["status"]["sync"]["status"] == "Synced", summary(app)
    live = synced.live("inferenceservice", "tiny-nowhere")
    cond = condition(live, "Degraded")
    assert cond["status"] == "True" and cond["reason"] == "NoMatchingNode", cond
    app = synced.wait_app(
        "the health message to be the operator's",
        lambda a: (
            (resource(a, KIND, "tiny-nowhere").get("health") or {}).get("message")
            == condition(synced.live("inferenceservice", "tiny-nowhere"), "Degraded")["message"]
        ),
    )
    sha = synced.commit({"examples/tiny-nowhere.yaml": None}, "remove it")
    synced.wait_synced_healthy(sha)


def test_progressing_while_real_pods_start_then_healthy(synced: GitOps) -> None:
    sha = synced.commit(
        {"examples/tiny-real.yaml": manifest(service("tiny-real", real_pods=True))}, "real pods"
    )
    seen: list[dict[str, Any]] = []

    def healthy(app: dict[str, Any]) -> bool:
        health = resource(app, KIND, "tiny-real").get("health") or {}
        if health and (not seen or seen[-1] != health):
            seen.append(health)
        return bool(health.get("status") == "Healthy")

    app = synced.wait_app("tiny-real Healthy (real pods)", healthy, timeout=420)
    progressing = [h for h in seen if h.get("status") == "Progressing"]
    assert progressing, f"never Progressing before Healthy: {seen}"
    assert [h for h in seen if h.get("status") == "Degraded"] == [], seen
    assert app["status"]["sync"]["revision"] == sha
    deployment = synced.live("deployment", "tiny-real")
    assert deployment["status"]["readyReplicas"] == 1


def test_no_perpetual_diff_across_refreshes_and_a_scale(synced: GitOps, stack: Stack) -> None:
    """KEDA (`stack`) scales an autoscaled service; Argo CD sees no diff and reverts nothing."""
    head = synced.repo.git("rev-parse", "HEAD")
    app = synced.wait_synced_healthy(head)
    generation = synced.live("inferenceservice", "tiny-auto")["metadata"]["generation"]
    # The autoscaler changes the replica count through the scale subresource. KEDA runs for real here and
    # would bring this idle service (its pods are kwok's, with no metrics) back to minReplicas, so it is told
    # to hold 3 replicas: KEDA's pause annotation, with which KEDA itself scales the Deployment to 3.
    synced.cluster.kubectl(
        "annotate", "scaledobject", "tiny-auto", "-n", SERVICES_NS, "autoscaling.keda.sh/paused-replicas=3"
    )
    wait_until(
        lambda: synced.live("deployment", "tiny-auto")["spec"].get("replicas") == 3,
        "KEDA to scale tiny-auto to 3",
        timeout=60,
    )
    refreshed: set[str] = {app["status"]["reconciledAt"]}
    began = time.monotonic()
    while len(refreshed) < 3:  # the one before, then two more of Argo CD's refresh cycles
        app = synced.app()
        assert app["status"]["sync"]["status"] == "Synced", summary(app)
        assert not out_of_sync(app), summary(app)
        refreshed.add(app["status"]["reconciledAt"])
        assert time.monotonic() - began < 6 * RESYNC_SECONDS + 60, f"only {len(refreshed)} refreshes"
        time.sleep(1)
    assert app["status"]["health"]["status"] == "Healthy", summary(app)
    assert synced.live("deployment", "tiny-auto")["spec"]["replicas"] == 3
    assert synced.live("inferenceservice", "tiny-auto")["metadata"]["generation"] == generation
    assert app["status"]["operationState"]["syncResult"]["revision"] == head  # no sync was needed


def test_engine_setting_commit_rolls_the_deployment(synced: GitOps) -> None:
    before = synced.live("deployment", "tiny")
    changed = service("tiny")
    changed["spec"]["engine"]["maxNumSeqs"] = 4
    sha = synced.commit({"examples/tiny.yaml": manifest(changed)}, "tiny: maxNumSeqs 4")
    app = synced.wait_synced_healthy(sha)
    assert resource(app, KIND, "tiny").get("health", {}).get("status") == "Healthy"
    after = synced.live("deployment", "tiny")
    assert after["metadata"]["generation"] > before["metadata"]["generation"]
    args = after["spec"]["template"]["spec"]["containers"][0].get("args") or []
    assert "--max-num-seqs" in args and args[args.index("--max-num-seqs") + 1] == "4", args
    assert after["status"].get("updatedReplicas") == after["status"].get("readyReplicas") == 1


def test_prune_deletes_the_service_and_gc_its_children(synced: GitOps) -> None:
    assert synced.exists("inferenceservice", "tiny-real")
    uid = synced.live("inferenceservice", "tiny-real")["metadata"]["uid"]
    children = [(kind, "tiny-real") for kind in ("deployment", "service", "poddisruptionbudget")]
    for kind, name in children:
        owners = synced.live(kind, name)["metadata"]["ownerReferences"]
        assert [o["uid"] for o in owners] == [uid], owners
    sha = synced.commit({"examples/tiny-real.yaml": None}, "remove tiny-real")
    app = synced.wait_synced_healthy(sha)
    assert resource(app, KIND, "tiny-real") == {}
    assert not synced.exists("inferenceservice", "tiny-real")
    for kind, name in children:
        wait_until(
            lambda k=kind, n=name: not synced.exists(k, n),
            f"the garbage collector to delete {kind}/{name}",
            timeout=120,
            interval=1,
        )
    pods = synced.cluster.kubectl(
        "get", "pods", "-n", SERVICES_NS, "-l", "pagoda.dev/inferenceservice=tiny-real", "-o", "name"
    )
    wait_until(
        lambda: (
            not synced.cluster.kubectl(
                "get", "pods", "-n", SERVICES_NS, "-l", "pagoda.dev/inferenceservice=tiny-real", "-o", "name"
            ).stdout.strip()
        ),
        f"the pods to go ({pods.stdout.strip()})",
        timeout=120,
        interval=1,
    )


def test_self_heal_reverts_a_hand_edit(synced: GitOps) -> None:
    head = synced.repo.git("rev-parse", "HEAD")
    before = synced.wait_synced_healthy(head)["status"]["operationState"]
    in_git = yaml.safe_load((synced.repo.path / "examples/tiny.yaml").read_text())["spec"]["engine"][
        "maxNumSeqs"
    ]
    synced.cluster.kubectl(
        "patch",
        "inferenceservice",
        "tiny",
        "-n",
        SERVICES_NS,
        "--type=merge",
        "--patch",
        '{"spec": {"engine": {"maxNumSeqs": 2}}}',
    )
    edited = synced.live("inferenceservice", "tiny")
    assert edited["spec"]["engine"]["maxNumSeqs"] == 2
    wait_until(
        lambda: synced.live("inferenceservice", "tiny")["spec"]["engine"]["maxNumSeqs"] == in_git,
        "self-heal to revert the hand edit",
        timeout=120,
        interval=1,
    )
    app = synced.wait_synced_healthy(head)
    operation = app["status"]["operationState"]
    # A new sync, started by Argo CD itself (self-heal), to the same revision.
    assert operation["startedAt"] > before["startedAt"], (before, operation)
    assert operation["operation"]["initiatedBy"].get("automated") is True, operation
    assert operation["syncResult"]["revision"] == head
