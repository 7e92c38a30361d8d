"""The Helm chart on the real local control plane, the way a platform team uses it.

1. Every scenario under charts/pagoda/ci/ is validated by the real API server (server-side dry-run with
   strict field validation: the Kubernetes schemas, the CRDs' schemas, unknown fields rejected).
2. `helm install`; the operator then runs as the chart's pod on the real node, from its image, with the
   chart's ServiceAccount, so the API server enforces exactly the chart's RBAC, and reconciles samples to
   Ready.
3. Argo CD's view: the user's manifests show no diff after the operator has reconciled (`kubectl diff`),
   the operator owns no field of the spec, an autoscaled Deployment carries no operator-owned
   spec.replicas (a replica count set by the autoscaler survives reconciles), and the Lua health check
   reports the live object Healthy.
4. `helm upgrade` adds and removes objects; `helm uninstall` leaves nothing behind but the CRD it was
   told to keep, and deletes that too when crds.keep=false.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fixtures import scratch
from e2e.lab.addons import wait_established
from e2e.lab.chartenv import (
    CHART,
    CRD_NAME,
    CRD_NAMES,
    ChartOperator,
    adopt_crd,
    condition,
    helm,
    kubectl_json,
    managed_fields,
)
from e2e.lab.cluster import Cluster
from e2e.lab.processes import REPO_ROOT, wait_until
from e2e.lab.samples import tiny_sample
from e2e.lab.stack import Stack

pytestmark = pytest.mark.e2e

RELEASE = "pagoda"
RESYNC = "operator.extraArgs={--resync-seconds=3}"
# The operator watches every namespace, other tests' too: writing into one being deleted is refused with 403
# by the API server's NamespaceLifecycle admission, whatever the RBAC.
NAMESPACE_TERMINATING = "because it is being terminated"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
HEALTH_LUA = (
    REPO_ROOT / "argocd" / "resource_customizations" / "pagoda.dev" / "InferenceService" / "health.lua"
)


def sample(namespace: str, name: str, autoscaled: bool = False) -> dict[str, Any]:
    obj = tiny_sample(namespace, name)
    if autoscaled:
        obj["spec"].pop("replicas", None)
        obj["spec"]["autoscaling"] = {"minReplicas": 1, "maxReplicas": 4, "targetQueueDepth": 4}
        obj["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True}}  # autoscaling needs metrics
    return dict(obj)


def release_objects(cluster: Cluster, namespace: str) -> list[tuple[str, str, str]]:
    """(kind, namespace, name) of every object in the release's manifest."""
    manifest = helm(cluster, "get", "manifest", RELEASE, "-n", namespace).stdout
    return [
        (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        for doc in yaml.safe_load_all(manifest)
        if doc
    ]


def exists(cluster: Cluster, kind: str, namespace: str, name: str) -> bool:
    args = ["get", kind, name, "--ignore-not-found", "-o", "name"] + (["-n", namespace] if namespace else [])
    return bool(cluster.kubectl(*args).stdout.strip())


@pytest.fixture(scope="module")
def workdir(request: pytest.FixtureRequest) -> Iterator[Path]:
    with scratch(request, "pagoda-chart-") as path:
        yield path


@pytest.fixture(scope="module")
def release_ns(cluster: Cluster) -> Iterator[str]:
    name = f"pagoda-system-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    yield name
    helm(cluster, "uninstall", RELEASE, "-n", name, "--ignore-not-found", check=False)
    cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")
    # Leave the CRD installed for the tests that come after (as the harness' users expect it).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))


@pytest.fixture(scope="module")
def installed(cluster: Cluster, release_ns: str) -> str:
    adopt_crd(cluster, RELEASE, release_ns)
    # A resync every 3 s instead of the operator's default, so that the tests need not wait for one.
    result = helm(cluster, "install", RELEASE, str(CHART), "-n", release_ns, f"--set={RESYNC}")
    assert f"kubectl -n {release_ns} rollout status deployment/pagoda" in result.stdout  # NOTES.txt
    wait_established(cluster, [f"crd/{CRD_NAME}"], timeout=60)
    return result.stdout


@pytest.fixture(scope="module")
def operator(cluster: Cluster, release_ns: str, installed: str) -> Iterator[ChartOperator]:
    """The chart's operator: its pod on the real node, from the image in the local registry, with the
    chart's ServiceAccount (so the API server enforces the chart's RBAC)."""
    running = ChartOperator(cluster, release_ns).wait_ready()
    yield running
    print(f"\nThe operator's log:\n{running.log()[-4000:]}")


@pytest.fixture(scope="module")
def samples(cluster: Cluster, operator: ChartOperator, workdir: Path) -> Iterator[tuple[str, Path]]:
    """A plain and an autoscaled InferenceService, applied like Argo CD applies (client-side apply)."""
    namespace = f"chart-samples-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    path = workdir / "samples.yaml"
    path.write_text(
        yaml.safe_dump_all([sample(namespace, "tiny"), sample(namespace, "tiny-auto", autoscaled=True)])
    )
    cluster.kubectl("apply", "-f", str(path))
    try:
        for name in ("tiny", "tiny-auto"):

            def ready(name: str = name) -> bool:
                operator.healthy()  # fails at once, with its log, if the operator died
                live = kubectl_json(cluster, "get", "inferenceservice", name, "-n", namespace)
                degraded = condition(live, "Degraded")
                assert degraded.get("reason") != "Forbidden", degraded[
                    "message"
                ]  # the chart's RBAC falls short
                return condition(live, "Ready").get("status") == "True"

            wait_until(ready, f"InferenceService {namespace}/{name} to be Ready", timeout=180, interval=1)
        yield namespace, path
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", "--ignore-not-found")


@pytest.mark.parametrize("values", SCENARIOS, ids=[p.name.removesuffix("-values.yaml") for p in SCENARIOS])
def test_scenario_manifests_pass_the_api_servers_validation(
    cluster: Cluster, values: Path, workdir: Path
) -> None:
    namespace = f"dry-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    cluster.kubectl("create", "namespace", "pagoda-tenant-a", check=False)  # the namespaced scenario's target
    try:
        version = kubectl_json(cluster, "version")["serverVersion"]["gitVersion"]
        rendered = helm(
            cluster,
            "template",
            RELEASE,
            str(CHART),
            "-n",
            namespace,
            "-f",
            str(values),
            "--kube-version",
            version,
        ).stdout
        docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
        assert docs
        result = cluster.kubectl(
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "--force-conflicts",
            "--field-manager=pagoda-chart-validation",
            "-f",
            "-",
            input=rendered,
        )
        applied = [line for line in result.stdout.splitlines() if "(server dry run)" in line]
        assert len(applied) == len(docs), result.stdout
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false")


def test_install_creates_every_object(cluster: Cluster, release_ns: str, installed: str) -> None:
    objects = release_objects(cluster, release_ns)
    kinds = {kind for kind, _, _ in objects}
    assert {
        "CustomResourceDefinition",
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "Service",
        "ConfigMap",
    } <= kinds
    for kind, namespace, name in objects:
        assert exists(cluster, kind, namespace, name), f"{kind} {namespace}/{name} missing after install"
    crd = kubectl_json(cluster, "get", "crd", CRD_NAME)
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


# How the operator logs a failed API call: error='<status> <Reason>: <message>' (kube/client.py KubeError).
API_ERROR = re.compile(r"""\berror=(['"])(?P<status>\d{3}) (?P<reason>[A-Za-z]*):""")
# What kopf logs when its watches or lists are refused.
KOPF_REFUSED = ("Not enough permissions", "APIForbiddenError")


def permission_errors(log: str) -> list[str]:
    """Log lines that report a refused API call: a parsed status 403 or reason Forbidden, or kopf's
    warnings (never a bare "403", which a timestamp's milliseconds can contain)."""
    found = []
    for line in log.splitlines():
        if NAMESPACE_TERMINATING in line:
            continue  # the NamespaceLifecycle admission plugin's 403, not RBAC (another test's namespace)
        match = API_ERROR.search(line)
        if match and (match["status"] == "403" or match["reason"] == "Forbidden"):
            found.append(line)
        elif any(phrase in line for phrase in KOPF_REFUSED):
            found.append(line)
    return found


def test_permission_errors_match_errors_not_timestamps() -> None:
    ok = "2026-05-01 22:45:21,403 level=INFO logger=pagoda.operator.reconcile Created Deployment name=x"
    refused = (
        "2026-05-01 22:45:22,118 level=WARNING logger=pagoda.operator.workqueue Failed to reconcile name=x "
        "namespace=y retry_in=1s error='403 Forbidden: deployments.apps is forbidden: User cannot patch'"
    )
    other = "2026-05-01 22:45:23,403 level=WARNING logger=x Failed error='409 Conflict: 403 objects'"
    assert permission_errors("\n".join([ok, other])) == []
    assert permission_errors("\n".join([ok, refused, other])) == [refused]
    terminating = (
        "2026-12-02 10:25:51,272 level=WARNING logger=pagoda.operator.events Failed to record Event "
        'error=\'403 Forbidden: events "tiny." is forbidden: unable to create new content in namespace t-x '
        "because it is being terminated'"
    )
    assert permission_errors(terminating) == []


def test_operator_with_the_charts_rbac_reconciles_samples_to_ready(
    cluster: Cluster, release_ns: str, operator: ChartOperator, samples: tuple[str, Path]
) -> None:
    namespace, _ = samples
    for kind in ("deployment", "service", "poddisruptionbudget"):
        for name in ("tiny", "tiny-auto"):
            assert exists(cluster, kind, namespace, name), f"{kind} {name}"
    assert exists(cluster, "scaledobject", namespace, "tiny-auto")
    assert not exists(cluster, "scaledobject", namespace, "tiny")
    events = kubectl_json(cluster, "get", "events", "-n", namespace)["items"]
    assert any(e.get("reportingComponent") == "pagoda-operator" for e in events)
    refused = permission_errors(operator.log())
    assert not refused, "the operator was refused API calls with the chart's RBAC:\n" + "\n".join(refused)
    assert operator.total("pagoda_operator_reconcile_errors_total", reason="Forbidden") == 0
    # The API server enforced the ServiceAccount's permissions: what the chart does not grant is refused.
    who = f"--as=system:serviceaccount:{release_ns}:pagoda"
    assert (
        cluster.kubectl("auth", "can-i", "patch", "deployments", "-A", who, check=False).stdout.strip()
        == "yes"
    )
    for verb, resource in (("get", "secrets"), ("update", "deployments"), ("delete", "inferenceservices")):
        answer = cluster.kubectl("auth", "can-i", verb, resource, "-A", who, check=False).stdout.strip()
        assert answer == "no", f"{verb} {resource}: {answer}"


def test_the_operator_binds_the_pickers_cluster_role_and_holds_no_other_lease(
    cluster: Cluster, release_ns: str, operator: ChartOperator, samples: tuple[str, Path]
) -> None:
    """Issue #40 §8, enforced by the API server: as the chart's ServiceAccount, a RoleBinding to the endpoint
    pickers' ClusterRole passes RBAC's escalation check (the `bind` rule), while a Role with the same Lease
    rule is refused (the operator holds no Lease rule to grant), and no Lease outside the release's
    namespace may be read or written, kube-system's included."""
    namespace, _ = samples
    who = f"--as=system:serviceaccount:{release_ns}:pagoda"
    picker_role = f"{RELEASE}-endpoint-picker"
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "bind-check", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": picker_role},
        "subjects": [{"kind": "ServiceAccount", "name": "bind-check", "namespace": namespace}],
    }
    created = cluster.kubectl("create", "-f", "-", who, input=json.dumps(binding), check=False)
    assert created.returncode == 0, created.stderr
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "lease-check", "namespace": namespace},
        "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["update"]}],
    }
    refused = cluster.kubectl("create", "-f", "-", who, input=json.dumps(role), check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr
    for verb, where in (("update", "kube-system"), ("get", "kube-system"), ("create", namespace)):
        answer = cluster.kubectl("auth", "can-i", verb, "leases", "-n", where, who, check=False)
        assert answer.stdout.strip() == "no", f"{verb} leases in {where}: {answer.stdout}"
    own = cluster.kubectl(
        "auth", "can-i", "update", "leases/pagoda-leader", "-n", release_ns, who, check=False
    )
    assert own.stdout.strip() == "yes"


def test_argocd_sees_no_diff_after_the_operator_reconciled(
    cluster: Cluster, operator: ChartOperator, samples: tuple[str, Path]
) -> None:
    namespace, path = samples
    before = operator.reconciles()
    wait_until(
        lambda: operator.reconciles() >= before + 4, "a few more reconcile passes (resync)", timeout=60
    )
    # kubectl diff compares the manifests with a server-side dry-run of applying them: exit 0 is "no diff".
    diff = cluster.kubectl("diff", "-f", str(path), check=False)
    assert diff.returncode == 0, diff.stdout + diff.stderr
    for name in ("tiny", "tiny-auto"):
        live = kubectl_json(cluster, "get", "inferenceservice", name, "-n", namespace)
        # Only the user (kubectl's client-side apply, as Argo CD's) owns spec fields; others only the status.
        entries = managed_fields(cluster, "inferenceservice", namespace, name)
        others = [e for e in entries if e["manager"] != "kubectl-client-side-apply"]
        assert any(e.get("subresource") == "status" for e in others), (
            f"no status written on {name}: {entries}"
        )
        for entry in others:
            assert entry.get("subresource") == "status", (
                f"{entry['manager']} owns spec fields of {name}: {entry}"
            )
        assert live["metadata"]["generation"] == 1, "the spec was changed after the user applied it"


def test_autoscaled_deployment_replicas_belong_to_the_autoscaler(
    cluster: Cluster, operator: ChartOperator, samples: tuple[str, Path], stack: Stack
) -> None:
    namespace, _ = samples
    (applied,) = managed_fields(cluster, "deployment", namespace, "tiny-auto", "pagoda-operator")
    assert applied["operation"] == "Apply"
    assert "f:replicas" not in applied["fieldsV1"].get("f:spec", {}), "the operator owns spec.replicas"
    # What the autoscaler does through the scale subresource must survive the operator's next passes. KEDA
    # runs for real here and reads this idle service's load as 0 (its replica queries answer 0 without scrape
    # targets), so the HPA would bring a plain `kubectl scale` back to minReplicas at its next sync: KEDA is
    # told to hold 3 replicas instead (its pause annotation), and scales the Deployment to 3 itself.
    cluster.kubectl(
        "annotate", "scaledobject", "tiny-auto", "-n", namespace, "autoscaling.keda.sh/paused-replicas=3"
    )

    def replicas() -> Any:
        deployment = kubectl_json(cluster, "get", "deployment", "tiny-auto", "-n", namespace)
        return deployment["spec"].get("replicas")

    wait_until(lambda: replicas() == 3, "KEDA to scale tiny-auto to 3", timeout=60)
    before = operator.reconciles()
    wait_until(lambda: operator.reconciles() >= before + 4, "reconcile passes after scaling", timeout=60)
    assert replicas() == 3
    # A fixed-size service keeps its replicas owned by the operator, from spec.replicas.
    (applied,) = managed_fields(cluster, "deployment", namespace, "tiny", "pagoda-operator")
    assert "f:replicas" in applied["fieldsV1"]["f:spec"]


def test_argocd_health_check_reports_the_live_object_healthy(
    cluster: Cluster, samples: tuple[str, Path]
) -> None:
    import lupa.lua51 as lua51

    namespace, _ = samples
    live = kubectl_json(cluster, "get", "inferenceservice", "tiny", "-n", namespace)
    lua = lua51.LuaRuntime()

    def to_lua(value: Any) -> Any:
        if isinstance(value, dict):
            return lua.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return lua.table_from([to_lua(v) for v in value])
        return value

    lua.globals().obj = to_lua(live)
    result = lua.execute(HEALTH_LUA.read_text())
    assert result["status"] == "Healthy", (result["status"], result["message"], live.get("status"))
    # A spec change the operator has not observed yet is Progressing, whatever the old conditions say.
    stale = copy.deepcopy(live)
    stale["metadata"]["generation"] += 1
    lua.globals().obj = to_lua(stale)
    assert lua.execute(HEALTH_LUA.read_text())["status"] == "Progressing"


def test_upgrade_adds_and_removes_objects(cluster: Cluster, release_ns: str, operator: ChartOperator) -> None:
    monitoring = CHART / "ci" / "monitoring-values.yaml"
    helm(cluster, "upgrade", RELEASE, str(CHART), "-n", release_ns, "-f", str(monitoring))
    assert exists(cluster, "servicemonitor", release_ns, "pagoda")
    assert exists(cluster, "prometheusrule", release_ns, "pagoda")
    cm = kubectl_json(cluster, "get", "configmap", "pagoda-dashboard-inferenceservice", "-n", release_ns)
    assert cm["metadata"]["annotations"]["grafana_folder"] == "Pagoda"
    # Without values Helm would reuse the last release's; --reset-values goes back to the chart's defaults.
    helm(cluster, "upgrade", RELEASE, str(CHART), "-n", release_ns, "--reset-values")
    assert not exists(cluster, "servicemonitor", release_ns, "pagoda")
    assert not exists(cluster, "prometheusrule", release_ns, "pagoda")
    history = yaml.safe_load(helm(cluster, "history", RELEASE, "-n", release_ns, "-o", "yaml").stdout)
    assert [h["revision"] for h in history] == [1, 2, 3] and history[-1]["status"] == "deployed"
    assert operator.wait_ready().healthy()  # the upgrades changed its arguments: a new pod


def test_uninstall_leaves_nothing_behind_but_the_kept_crd(
    cluster: Cluster, release_ns: str, operator: ChartOperator, samples: tuple[str, Path]
) -> None:
    namespace, _ = samples
    objects = release_objects(cluster, release_ns)
    cluster.kubectl("delete", "namespace", namespace, "--timeout=120s", timeout=150)
    helm(cluster, "uninstall", RELEASE, "-n", release_ns, "--wait")
    for kind, ns, name in objects:
        if kind == "CustomResourceDefinition":
            assert exists(cluster, kind, ns, name), "crds.keep=true must keep the CRD"
        else:
            assert not exists(cluster, kind, ns, name), f"{kind} {ns}/{name} left behind"

    def labelled() -> list[str]:
        return cluster.kubectl(
            "get",
            "all,configmaps,serviceaccounts,roles,rolebindings,clusterroles,clusterrolebindings,"
            "servicemonitors,prometheusrules,crds",
            "-A",
            "-l",
            f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/part-of=pagoda",
            "-o",
            "name",
        ).stdout.split()

    # The operator's pod goes after its Deployment (the garbage collector, then the kubelet's grace period).
    kept = sorted(f"customresourcedefinition.apiextensions.k8s.io/{name}" for name in CRD_NAMES)
    wait_until(lambda: sorted(labelled()) == kept, "only the kept CRDs to be left", timeout=120, interval=1)
    assert not helm(cluster, "list", "-n", release_ns, "-q").stdout.strip()


def test_uninstall_with_keep_off_deletes_the_crd(cluster: Cluster, release_ns: str) -> None:
    adopt_crd(cluster, RELEASE, release_ns)
    helm(cluster, "install", RELEASE, str(CHART), "-n", release_ns, "--set", "crds.keep=false")
    crd = kubectl_json(cluster, "get", "crd", CRD_NAME)
    assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    helm(cluster, "uninstall", RELEASE, "-n", release_ns, "--wait")
    for name in CRD_NAMES:
        wait_until(
            lambda name=name: not exists(cluster, "crd", "", name),
            f"the CRD {name} to be deleted",
            timeout=60,
        )
