"""Helpers for the chart's e2e tests: Helm against the local control plane, a kubeconfig for the chart's
ServiceAccount (so that the real API server enforces the chart's RBAC), and the operator run with it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e.cluster import Cluster
from e2e.observability import free_port, wait_until

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


class Operator:
    """`pagoda-operator` as a local subprocess with the given kubeconfig."""

    def __init__(self, kubeconfig: Path, workdir: Path, resync_seconds: float = 3) -> None:
        self.kubeconfig, self.workdir, self.resync_seconds = kubeconfig, workdir, resync_seconds
        self.port = free_port()
        self.log_path = workdir / "operator.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Operator:
        exe = Path(sys.executable).parent / "pagoda-operator"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(exe), "--kubeconfig", str(self.kubeconfig), "--metrics-host", "127.0.0.1"]
                + ["--metrics-port", str(self.port), "--resync-seconds", str(self.resync_seconds)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_until(self.healthy, "the operator's /healthz", timeout=60)
        return self

    def healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"pagoda-operator exited rc={self.proc.returncode}:\n{self.log()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def reconciles(self) -> float:
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("pagoda_operator_reconciles_total{")
        )

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


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
