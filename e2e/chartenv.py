"""Helpers for the chart's e2e tests: Helm against the local control plane, a kubeconfig for the chart's
ServiceAccount (so that the real API server enforces the chart's RBAC; the operator runs with it, as
e2e.processes.OperatorProcess), and small kubectl helpers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from e2e.cluster import Cluster

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "pagoda"
CRD_NAME = "inferenceservices.pagoda.dev"


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
    """Let Helm adopt an InferenceService CRD that something else (another test, `make demo`) applied:
    Helm's documented way is its ownership label and annotations on the existing object."""
    found = cluster.kubectl("get", "crd", CRD_NAME, "--ignore-not-found", "-o", "name").stdout.strip()
    if not found:
        return
    cluster.kubectl("label", "--overwrite", "crd", CRD_NAME, "app.kubernetes.io/managed-by=Helm")
    cluster.kubectl(
        "annotate",
        "--overwrite",
        "crd",
        CRD_NAME,
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
