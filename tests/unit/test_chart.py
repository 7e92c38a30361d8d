"""The Helm chart, rendered by the real Helm binary (built from e2e/lab/tools into .pagoda-dev/bin by make
tools).

No cluster here: `helm lint` and `helm template` for every scenario under charts/pagoda/ci/, checked for the
contracts of the chart (labels, RBAC without wildcards that covers every call the operator makes, CRDs
identical to the generated ones, the keep switch, a strict schema, requests but no limits, commented
values). The rendered manifests are validated by the real API server in e2e/test_chart.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.version import Version

from pagoda.operator.handlers import OBSERVED_KINDS
from pagoda.operator.resources import CHILD_KINDS, DEFAULT_RUNTIME_IMAGE
from pagoda.operator.resources.routing import PICKER_CLUSTER_RULES
from pagoda.operator.status.nodes import NODE_KIND
from tests.repo import REPO

CHART = REPO / "charts" / "pagoda"
SCENARIOS = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE_VERSION = "1.36.3"  # the version e2e/lab/tools pins; `helm template` assumes an old default otherwise
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def helm_bin() -> str:
    candidates = [Path(os.environ.get("PAGODA_BIN") or REPO / ".pagoda-dev" / "bin") / "helm"]
    for path in candidates:
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("helm")
    if found:
        return found
    pytest.fail(f"helm not found in {candidates[0].parent} or on PATH: run `make tools`", pytrace=False)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([helm_bin(), *args], capture_output=True, text=True, timeout=120)
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render(*args: str, namespace: str = "pagoda-system", release: str = "pagoda") -> list[dict[str, Any]]:
    out = helm("template", release, str(CHART), "-n", namespace, "--kube-version", KUBE_VERSION, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = find(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


@pytest.fixture(
    scope="module", params=SCENARIOS, ids=[p.name.removesuffix("-values.yaml") for p in SCENARIOS]
)
def scenario(request: pytest.FixtureRequest) -> tuple[Path, list[dict[str, Any]]]:
    path: Path = request.param
    return path, render("-f", str(path))


@pytest.fixture(scope="module")
def default_docs() -> list[dict[str, Any]]:
    return render()


def test_scenarios_exist() -> None:
    names = {p.name for p in SCENARIOS}
    assert {"default-values.yaml", "monitoring-values.yaml", "namespaced-values.yaml"} <= names


@pytest.mark.parametrize("values", [None, *SCENARIOS], ids=["no-values", *[p.name for p in SCENARIOS]])
def test_helm_lint_strict(values: Path | None) -> None:
    args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
    result = helm(*args, *(["-f", str(values)] if values else []), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_every_object_carries_the_chart_labels(scenario: tuple[Path, list[dict[str, Any]]]) -> None:
    _, docs = scenario
    assert docs
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        where = f"{doc['kind']}/{doc['metadata']['name']}"
        assert labels.get("app.kubernetes.io/name") == "pagoda", where
        assert labels.get("app.kubernetes.io/instance") == "pagoda", where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("app.kubernetes.io/version") == CHART_META["appVersion"], where
        assert labels.get("helm.sh/chart") == f"pagoda-{CHART_META['version']}", where


def test_selectors_hold_nothing_version_dependent(scenario: tuple[Path, list[dict[str, Any]]]) -> None:
    _, docs = scenario
    deployment = only(docs, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert set(selector) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
    }
    assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert only(docs, "Service")["spec"]["selector"] == selector


def test_rbac_has_no_wildcards(scenario: tuple[Path, list[dict[str, Any]]]) -> None:
    _, docs = scenario
    roles = find(docs, "ClusterRole") + find(docs, "Role")
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), f"{role['metadata']['name']}: wildcard in {field}"
            assert "nonResourceURLs" not in rule
            if role["metadata"]["name"] != "pagoda-self" and rule["verbs"] != ["bind"]:
                assert "resourceNames" not in rule  # names only its own Secret and Lease, and what it binds


def test_the_operator_reads_only_its_own_key_and_lease(scenario: tuple[Path, list[dict[str, Any]]]) -> None:
    """In the release's namespace: its one Secret (`get` and `update` by name, `create`, which RBAC cannot
    limit to a name that does not exist yet, for the first replica that finds none:
    operator/kube/management.py) and its leader Lease (kube/leader.py)."""
    _, docs = scenario
    (role,) = find(docs, "Role", "pagoda-self")
    assert role["metadata"]["namespace"] == "pagoda-system"
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["secrets"],
            "resourceNames": ["pagoda-management-key"],
            "verbs": ["get", "update"],  # update: its rotation (kube/management.py)
        },
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["pagoda-leader"],
            "verbs": ["get", "update"],
        },
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]
    (binding,) = find(docs, "RoleBinding", "pagoda-self")
    account = only(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "pagoda-system"}]
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--management-key-secret=pagoda-system/pagoda-management-key" in args
    assert "--leader-elect=pagoda-system/pagoda-leader" in args


def test_two_replicas_elect_a_leader_and_keep_one_through_drains(default_docs: list[dict[str, Any]]) -> None:
    deployment = only(default_docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    pdb = only(default_docs, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert find(render("--set", "operator.replicas=1"), "PodDisruptionBudget") == []


PICKER_ROLE = "pagoda-endpoint-picker"  # the endpoint pickers', bound by the operator, not to it


def grants(docs: list[dict[str, Any]], kind: str) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs granted to the operator by the roles of `kind` (Role or ClusterRole)."""
    out: dict[tuple[str, str], set[str]] = {}
    for role in find(docs, kind):
        if role["metadata"]["name"] == PICKER_ROLE:
            continue
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def test_rbac_grants_exactly_what_the_operator_calls(default_docs: list[dict[str, Any]]) -> None:
    granted = grants(default_docs, "ClusterRole")
    expected: dict[tuple[str, str], set[str]] = {
        ("pagoda.dev", "inferenceservices"): {"get", "list", "watch"},
        ("pagoda.dev", "inferenceservices/status"): {"patch"},
        ("", "events"): {"create"},
        ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
        # GPUBudgets (reconcile/gpubudget.py): watched, their status written, members' namespaces read.
        ("pagoda.dev", "gpubudgets"): {"list", "watch"},
        ("pagoda.dev", "gpubudgets/status"): {"patch"},
        ("", "namespaces"): {"get"},
    }
    for api_version, _kind, plural in CHILD_KINDS:  # the operator's own list of child kinds
        group = api_version.rpartition("/")[0]
        expected[(group, plural)] = {"list", "watch", "create", "patch", "delete"}
    for api_version, _kind, plural in [*OBSERVED_KINDS, NODE_KIND]:  # watched and listed, never written
        expected[(api_version.rpartition("/")[0], plural)] = {"list", "watch"}
    # spec.engine.chatTemplate.configMap: the user's ConfigMap is read (reconcile/chattemplate.py).
    expected[("", "configmaps")].add("get")
    # spec.routing: the endpoint pickers' RoleBindings refer to the chart's ClusterRole, which the operator
    # may bind (and holds none of its rules).
    expected[("rbac.authorization.k8s.io", "clusterroles")] = {"bind"}
    assert granted == expected


def test_secret_check_is_opt_in() -> None:
    assert ("", "secrets") not in grants(render(), "ClusterRole")
    assert grants(render("--set", "rbac.secretExistenceCheck=true"), "ClusterRole")[("", "secrets")] == {
        "get"
    }


def test_namespaced_scenario_writes_only_in_its_namespace() -> None:
    docs = render("-f", str(CHART / "ci" / "namespaced-values.yaml"))
    (role,) = find(docs, "Role", "pagoda-operator")
    (binding,) = find(docs, "RoleBinding", "pagoda-operator")
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "pagoda-tenant-a"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "pagoda", "namespace": "pagoda-system"}]
    cluster_wide = grants(docs, "ClusterRole")
    assert all(verbs <= {"list", "watch"} for verbs in cluster_wide.values()), cluster_wide
    assert ("", "namespaces") in cluster_wide  # kopf lists namespaces when it watches only some
    assert ("pagoda.dev", "gpubudgets") not in cluster_wide  # a budget is the cluster-wide operator's
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=pagoda-tenant-a" in args


def test_one_version_names_the_chart_its_images_and_the_package() -> None:
    """The chart's version is its appVersion, the tag of the operator's image (above) and of the operator's
    default runtime image (what a GPU service runs unless it names one), and the Python package's version
    (PEP 440's spelling of the same): a release bumps them together (RELEASES.md)."""
    version = CHART_META["version"]
    assert CHART_META["appVersion"] == version
    assert DEFAULT_RUNTIME_IMAGE == f"ghcr.io/pagoda-dev/pagoda-runtime:{version}"
    package = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert Version(package) == Version(version), (package, version)


def test_operator_deployment_defaults(default_docs: list[dict[str, Any]]) -> None:
    deployment = only(default_docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "pagoda"
    (container,) = pod["containers"]
    assert container["image"] == f"ghcr.io/pagoda-dev/pagoda-operator:{CHART_META['appVersion']}"
    assert container["command"] == ["pagoda-operator"]
    assert container["args"] == [
        "--metrics-port=8080",
        "--management-key-secret=pagoda-system/pagoda-management-key",
        "--leader-elect=pagoda-system/pagoda-leader",
        "--allow-from-namespace=pagoda-system",  # the operator's calls to the runtime pods
        "--allow-from-namespace=monitoring",  # Prometheus's scrapes (networkPolicy.allowFromNamespaces)
        "--picker-cluster-role=pagoda-endpoint-picker",  # spec.routing's pickers (templates/rbac.yaml)
        "--max-concurrent-rollouts=1",  # an upgrade's template changes roll one service at a time (rollouts)
        "--max-concurrent-profiles=2",  # at most 2 profile Jobs at once in the cluster (profiles)
    ]
    # Requests (a BestEffort operator starves on a busy node and misses its liveness probe), no limits.
    assert container["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = only(default_docs, "Service")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]


def test_the_namespaces_the_network_policies_admit_are_a_value() -> None:
    """Prometheus outside `monitoring`: with an enforcing network plugin its scrapes are refused unless
    networkPolicy.allowFromNamespaces names its namespace, and KEDA's fallback then holds the replicas
    (docs/install.md). The value replaces the default and becomes the operator's --allow-from-namespace, which
    every InferenceService's NetworkPolicy admits (resources/networkpolicy.py)."""
    docs = render("--set", "networkPolicy.allowFromNamespaces={observability,prometheus}")
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    admitted = [arg for arg in args if arg.startswith("--allow-from-namespace=")]
    assert admitted == [
        "--allow-from-namespace=pagoda-system",
        "--allow-from-namespace=observability",
        "--allow-from-namespace=prometheus",
    ]
    refused = helm(
        "template",
        "pagoda",
        str(CHART),
        "--set",
        "networkPolicy.allowFromNamespaces={Monitoring}",
        check=False,
    )
    assert refused.returncode != 0 and "allowFromNamespaces" in refused.stderr, refused.stderr


def test_image_digest_wins_over_tag() -> None:
    docs = render("-f", str(CHART / "ci" / "external-crds-values.yaml"))
    (container,) = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"].startswith("registry.example.com/mirror/pagoda-operator@sha256:")
    assert not find(docs, "CustomResourceDefinition") and not find(docs, "ServiceAccount")


def test_image_pull_secrets_are_the_operator_pods() -> None:
    """`imagePullSecrets` is the operator pod's (its own image); the runtime pods take theirs from each
    InferenceService's spec.runtime.imagePullSecrets."""
    assert "imagePullSecrets" not in only(render(), "Deployment")["spec"]["template"]["spec"]
    docs = render("-f", str(CHART / "ci" / "external-crds-values.yaml"))
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["imagePullSecrets"] == [
        {"name": "mirror-pull"}
    ]
    docs = render(
        "--set", "imagePullSecrets[0].name=regcred", "--set", "imagePullSecrets[1].name=mirror.pull"
    )
    pod = only(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror.pull"}]


def test_runtime_image_value_becomes_the_operator_flag() -> None:
    image = "registry.example.com/mirror/pagoda-runtime:0.1.0"
    docs = render("--set", f"operator.runtimeImage={image}")
    (container,) = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert f"--runtime-image={image}" in container["args"]
    refused = helm("template", "pagoda", str(CHART), "--set", "operator.runtimeImage=two words", check=False)
    assert refused.returncode != 0 and "runtimeImage" in refused.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    generated = sorted(p.name for p in (REPO / "crds").glob("*.yaml"))
    assert generated, "crds/ is empty: run `make crds`"
    for name in generated:
        copy = CHART / "files" / "crds" / name
        assert copy.is_file(), f"{copy} is missing: run `make crds`"
        assert copy.read_bytes() == (REPO / "crds" / name).read_bytes(), f"{copy} drifted: run `make crds`"


def test_rendered_crds_are_the_generated_crds_plus_labels(default_docs: list[dict[str, Any]]) -> None:
    rendered = {d["metadata"]["name"]: d for d in find(default_docs, "CustomResourceDefinition")}
    files = sorted((REPO / "crds").glob("*.yaml"))
    assert len(rendered) == len(files) == 2  # InferenceService and GPUBudget
    for path in files:
        generated = yaml.safe_load(path.read_text())
        crd = rendered[generated["metadata"]["name"]]
        assert crd["spec"] == generated["spec"]
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"


def test_crd_keep_switch() -> None:
    for kept in find(render("--set", "crds.keep=true"), "CustomResourceDefinition"):
        assert kept["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    dropped = find(render("--set", "crds.keep=false"), "CustomResourceDefinition")
    assert len(dropped) == 2
    for crd in dropped:
        assert "helm.sh/resource-policy" not in (crd["metadata"].get("annotations") or {})
    assert not find(render("--set", "crds.install=false"), "CustomResourceDefinition")


def test_dashboards_are_configmaps_for_the_grafana_sidecar(default_docs: list[dict[str, Any]]) -> None:
    maps = find(default_docs, "ConfigMap")
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert len(maps) == len(files) >= 2
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = cm["data"].items()
        source = CHART / "files" / "dashboards" / key.removeprefix("pagoda-")
        assert json.loads(text) == json.loads(source.read_text())
    assert not find(render("--set", "dashboards.enabled=false"), "ConfigMap")


def test_monitoring_scenario_objects() -> None:
    docs = render("-f", str(CHART / "ci" / "monitoring-values.yaml"))
    monitor = only(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == only(docs, "Service")["spec"]["selector"]
    rule = only(docs, "PrometheusRule")
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    assert alerts and all(a["labels"]["team"] == "ml-platform" for a in alerts)
    assert not find(render(), "ServiceMonitor") and not find(render(), "PrometheusRule")


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("operator.replicas=0", "replicas"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("crds.keep=maybe", "keep"),
        ("operator.watchNamespace=Not_A_Namespace", "watchNamespace"),
        ("prometheusRule.kvCacheUsageRatio=1.5", "kvCacheUsageRatio"),
        ("metrics.serviceMonitor.interval=often", "interval"),
        ("imagePullSecrets[0].name=Reg_Cred", "imagePullSecrets"),  # not a Secret name
        ("imagePullSecrets[0]=regcred", "imagePullSecrets"),  # a list of {name}, as in a pod
        ("imagePullSecrets[0].secret=regcred", "imagePullSecrets"),
        ("rollouts.maxConcurrent=0", "maxConcurrent"),  # a budget of none would never roll an upgrade
        ("profiles.maxConcurrent=0", "maxConcurrent"),  # ... nor run a profile
    ],
)
def test_schema_rejects_bad_values_naming_the_field(setting: str, field: str) -> None:
    result = helm(
        "template", "pagoda", str(CHART), "--kube-version", KUBE_VERSION, "--set", setting, check=False
    )
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr
    assert field in result.stderr


def _schema_leaves(schema: dict[str, Any], values: Any, prefix: str = "") -> set[str]:
    """Dotted paths of the schema's properties, down to values that are not (non-empty) mappings."""
    leaves: set[str] = set()
    for key, sub in schema.get("properties", {}).items():
        path = f"{prefix}{key}"
        value = values.get(key) if isinstance(values, dict) else None
        if "properties" in sub and isinstance(value, dict) and value:
            leaves |= _schema_leaves(sub, value, path + ".")
        else:
            leaves.add(path)
    return leaves


def _values_key_lines(lines: list[str]) -> dict[str, int]:
    """Dotted path -> line index of every mapping key in values.yaml (block style only)."""
    found: dict[str, int] = {}
    stack: list[tuple[int, str]] = []
    for index, line in enumerate(lines):
        match = re.match(r"^( *)([A-Za-z_][\w.-]*):", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match.group(2)))
        found[".".join(key for _, key in stack)] = index
    return found


def test_values_yaml_documents_every_schema_key_with_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys = _values_key_lines(lines)
    schema = json.loads((CHART / "values.schema.json").read_text())
    leaves = _schema_leaves(schema, yaml.safe_load("\n".join(lines))) - {"global"}
    missing = sorted(leaves - set(keys))
    assert not missing, f"keys in the schema but not in values.yaml: {missing}"
    undocumented = sorted(path for path in leaves if not lines[keys[path] - 1].lstrip().startswith("#"))
    assert not undocumented, f"values.yaml keys without a comment above them: {undocumented}"


def test_every_values_key_is_in_the_schema() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())

    def walk(value: Any, node: dict[str, Any], path: str) -> None:
        if "properties" not in node:
            return
        assert node.get("additionalProperties") is False, f"{path or 'root'}: schema is not strict"
        for key, sub in value.items():
            assert key in node["properties"], f"{path}{key} is not in values.schema.json"
            walk(sub, node["properties"][key], f"{path}{key}.")

    walk(values, schema, "")


def test_the_replicas_prefer_different_nodes_like_the_picker(default_docs: list[dict[str, Any]]) -> None:
    """One node lost takes at most one operator replica where the cluster has room (a preference, so a
    one-node cluster still runs both), as the endpoint picker's replicas (resources/routing.py)."""
    deployment = only(default_docs, "Deployment")
    affinity = deployment["spec"]["template"]["spec"]["affinity"]
    term = {"labelSelector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]}}
    term["topologyKey"] = "kubernetes.io/hostname"
    assert affinity == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]
        }
    }
    picker = deployment_of_picker()
    assert picker["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0].keys() == (
        affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0].keys()
    )
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}
    docs = render("--set-json", f"operator.affinity={json.dumps(own)}")
    assert only(docs, "Deployment")["spec"]["template"]["spec"]["affinity"] == own  # replaces the default


def deployment_of_picker() -> dict[str, Any]:
    """The endpoint picker's affinity, as the operator writes it for two replicas."""
    from pagoda.operator.resources.routing import _apart

    return _apart("tiny")


def test_the_operator_holds_no_lease_rule_beyond_its_own_lease() -> None:
    """The operator renews its own Lease only in the release's namespace (the Role `-self`), and holds no
    other Lease rule, cluster-wide or namespaced (issue #40 §8: it could take kube-system's Leases): the
    endpoint pickers' leader election is granted by binding the chart's ClusterRole, which the operator may
    `bind` by name and nothing else."""
    for docs in (render(), render("-f", str(CHART / "ci" / "namespaced-values.yaml"))):
        assert ("coordination.k8s.io", "leases") not in grants(docs, "ClusterRole")
        with_leases = [
            role["metadata"]
            for role in find(docs, "Role")
            if any("leases" in rule["resources"] for rule in role["rules"])
        ]
        assert [(m["name"], m["namespace"]) for m in with_leases] == [("pagoda-self", "pagoda-system")]
        (own,) = find(docs, "Role", "pagoda-self")
        renewed = [r for r in own["rules"] if r["resources"] == ["leases"] and "update" in r["verbs"]]
        assert [rule["resourceNames"] for rule in renewed] == [["pagoda-leader"]]
        binds = [
            rule
            for role in [*find(docs, "ClusterRole"), *find(docs, "Role")]
            if role["metadata"]["name"] != PICKER_ROLE
            for rule in role["rules"]
            if "bind" in rule["verbs"]
        ]
        assert [(rule["resources"], rule["resourceNames"]) for rule in binds] == [
            (["clusterroles"], [PICKER_ROLE])
        ]


def test_the_picker_cluster_role_is_what_the_operator_binds() -> None:
    """The chart's ClusterRole carries exactly routing.PICKER_CLUSTER_RULES, and the operator is started with
    its name, so the RoleBindings it makes refer to it; without rbac.create, no flag (each picker then gets
    a Role of its own)."""
    docs = render()
    (role,) = [r for r in find(docs, "ClusterRole") if r["metadata"]["name"] == PICKER_ROLE]
    assert role["rules"] == PICKER_CLUSTER_RULES
    args = only(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--picker-cluster-role={PICKER_ROLE}" in args
    bare = render("--set", "rbac.create=false")
    args = only(bare, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(arg.startswith("--picker-cluster-role") for arg in args)
