"""Helpers for the chart's e2e tests: Helm against the local control plane, the operator the chart runs (its
pod on the real node, from its image, under the chart's ServiceAccount and RBAC), a kubeconfig for that
ServiceAccount, and small kubectl helpers."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.lab.cluster import Cluster
from e2e.lab.processes import REPO_ROOT, OperatorMetrics, http_ok, wait_until

CHART = REPO_ROOT / "charts" / "pagoda"
CRD_NAME = "inferenceservices.pagoda.dev"
CRD_NAMES = (CRD_NAME, "gpubudgets.pagoda.dev")  # every CRD the chart installs (crds/)
OPERATOR_SELECTOR = "app.kubernetes.io/name=pagoda"  # the chart's selector labels name the operator's pod


def helm(
    cluster: Cluster, *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(cluster.bin_dir / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def kubectl_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(cluster.kubectl(*args, "-o", "json").stdout)


def adopt_crd(cluster: Cluster, release: str, namespace: str) -> None:
    """Let Helm adopt the chart's CRDs that something else (another test, `make demo`) applied: Helm's
    documented way is its ownership label and annotations on the existing object."""
    for name in CRD_NAMES:
        found = cluster.kubectl("get", "crd", name, "--ignore-not-found", "-o", "name").stdout.strip()
        if not found:
            continue
        cluster.kubectl("label", "--overwrite", "crd", name, "app.kubernetes.io/managed-by=Helm")
        cluster.kubectl(
            "annotate",
            "--overwrite",
            "crd",
            name,
            f"meta.helm.sh/release-name={release}",
            f"meta.helm.sh/release-namespace={namespace}",
            "helm.sh/resource-policy-",  # the chart sets it again when crds.keep is on
        )


def service_account_kubeconfig(cluster: Cluster, namespace: str, account: str, path: Path) -> Path:
    """A kubeconfig that authenticates as the ServiceAccount with a bound token (`kubectl create token`)."""
    token = cluster.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    admin = yaml.safe_load(cluster.kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    server = next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": server}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": account, "context": {"cluster": "local", "user": account}}],
        "current-context": account,
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            found: dict[str, Any] = cond
            return found
    return {}


def managed_fields(
    cluster: Cluster, kind: str, namespace: str, name: str, manager: str | None = None
) -> list[dict[str, Any]]:
    """The object's managedFields entries, of one field manager or all (kubectl hides them unless asked)."""
    obj = kubectl_json(cluster, "get", kind, name, "-n", namespace, "--show-managed-fields")
    entries: list[dict[str, Any]] = obj["metadata"].get("managedFields") or []
    return [m for m in entries if manager is None or m.get("manager") == manager]


@dataclass
class ChartOperator(OperatorMetrics):
    """The operator a release of the chart runs: its replicas' pods, read through the API (logs), and the
    leader's at its pod IP (/healthz, /metrics on the chart's `operator.metricsPort`)."""

    cluster: Cluster
    namespace: str
    port: int = 8080
    # Restarts a test caused on purpose, pod name -> count (a leader that could not renew its Lease while the
    # API server restarted exits by design): check_alive fails on any other.
    expected_restarts: dict[str, int] = field(default_factory=dict)

    def pods(self) -> list[dict[str, Any]]:
        listed = kubectl_json(self.cluster, "get", "pods", "-n", self.namespace, "-l", OPERATOR_SELECTOR)
        return [p for p in listed["items"] if not p["metadata"].get("deletionTimestamp")]

    def holders(self) -> set[str]:
        """The holderIdentity of the release's leader Lease: `<pod name>_<suffix>`, the suffix new in each
        operator process, so a leader that exited and came back, or a standby that took over, is another
        holder."""
        return {
            str((lease.get("spec") or {}).get("holderIdentity") or "")
            for lease in kubectl_json(self.cluster, "get", "leases", "-n", self.namespace)["items"]
        } - {""}

    def leader(self) -> dict[str, Any] | None:
        """The pod holding the release's leader Lease."""
        names = {holder.rpartition("_")[0] for holder in self.holders()}
        return next((p for p in self.pods() if p["metadata"]["name"] in names), None)

    def pod(self) -> dict[str, Any]:
        """The leader's pod (the one that reconciles); waits for one to be elected."""
        found: dict[str, Any] = wait_until(self.leader, "an operator replica to hold the leader Lease", 60)
        return found

    @property
    def url(self) -> str:
        return f"http://{self.pod()['status']['podIP']}:{self.port}"

    def wait_ready(self, timeout: float = 180) -> ChartOperator:
        """Waits for the Deployment's rollout: its one pod of the current template Ready (image pulled,
        /healthz answering)."""
        deployment = kubectl_json(
            self.cluster, "get", "deployments", "-n", self.namespace, "-l", OPERATOR_SELECTOR
        )
        (name,) = [d["metadata"]["name"] for d in deployment["items"]]
        self.cluster.rollout_status(self.namespace, name, timeout)
        return self

    def restarts(self) -> dict[str, int]:
        """Pod name -> how often its containers restarted."""
        return {
            pod["metadata"]["name"]: sum(
                c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or []
            )
            for pod in self.pods()
        }

    def check_alive(self) -> None:
        """Fails, with its last log, if an operator container restarted (it exited or its probe failed) but
        for the `expected_restarts`."""
        for name, restarts in self.restarts().items():
            assert restarts == self.expected_restarts.get(name, 0), (
                f"The operator pod {name} restarted {restarts} times:\n{self.log(previous=True)}"
            )

    def healthy(self) -> bool:
        """/healthz answers 200; fails at once, with its log, if the container restarted."""
        self.check_alive()
        return http_ok(f"{self.url}/healthz")

    def log(self, previous: bool = False) -> str:
        """The operator container's log (its last run's with `previous`), through the API server."""
        args = ["logs", "-n", self.namespace, "-l", OPERATOR_SELECTOR, "--tail=-1"]
        return self.cluster.kubectl(*args, *(["--previous"] if previous else []), check=False).stdout
