"""Argo CD beside a running local control plane (e2e.lab.cluster), run the way Argo CD's own development setup
runs it (its Procfile): Redis, the repo server and the application controller as local processes with
ARGOCD_FAKE_IN_CLUSTER=true (the in-cluster destination is the kubeconfig's cluster), helm and git on PATH,
and the objects an installation would create applied as manifests: the Application and AppProject CRDs,
the `argocd` namespace, argocd-cm (with Pagoda's health check merged in exactly as docs/gitops.md tells users,
from examples/argocd/argocd-cm.yaml), argocd-secret, argocd-rbac-cm and the `default` AppProject. A local Git
repository (file://) holds what a platform team would commit.

    with start_argocd(cluster, workdir) as argocd:      # returns once all three answer
        repo = GitRepo.create(workdir / "git")          # repo.url: file:///...
        repo.commit({"services/a.yaml": text}, "add a")
        argocd.apply_application(app)                   # an Application (dict)
        argocd.application("pagoda")                    # the live Application, its status is the oracle

The argocd binary (e2e/lab/tools/argocd: Argo CD's two command packages under one small main) and the CRDs
come from the cluster's bin_dir (built by e2e/lab/tools/build.sh); redis-server from Debian (`make packages`).
Every process logs to <workdir>/logs/NAME.log, dies with the process that started it, and is stopped by PID.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from e2e.lab.addons import APPLY, _kubectl, install_crds
from e2e.lab.processes import REPO_ROOT, ComponentProcess, StartError, free_ports, listens, wait_while_running

if TYPE_CHECKING:
    from e2e.lab.cluster import Cluster

NAMESPACE = "argocd"
ARGOCD_CRD_FILES = ("argoproj.io_applications.yaml", "argoproj.io_appprojects.yaml")
EXAMPLES = REPO_ROOT / "examples" / "argocd"
START_TIMEOUT = 120.0
# How often the controller compares every Application with Git and the cluster without being told to (its
# --app-resync, timeout.reconciliation in an installation; 120 s by default there). Short so that a test can
# watch several refresh cycles.
RESYNC_SECONDS = 10
PART_OF = {"app.kubernetes.io/part-of": "argocd"}


class ArgoCDMissingError(StartError):
    """The argocd binary, its CRDs or redis-server are missing."""


def check_argocd_files(bin_dir: Path) -> Path:
    """Returns redis-server's path; fails with what to run when something is missing."""
    missing = [] if os.access(bin_dir / "argocd", os.X_OK) else [str(bin_dir / "argocd")]
    missing += [
        f"{bin_dir}/crds/{name}" for name in ARGOCD_CRD_FILES if not (bin_dir / "crds" / name).is_file()
    ]
    if missing:
        raise ArgoCDMissingError(f"Argo CD's files are missing: {', '.join(missing)}. Run `make tools`.")
    redis = shutil.which("redis-server")
    if redis is None:
        raise ArgoCDMissingError("redis-server is not installed. Run `make packages` (Debian's package).")
    return Path(redis)


def settings_objects() -> list[dict[str, Any]]:
    """What Argo CD's install manifests create besides the workloads: its namespace, argocd-cm (the harness's
    timing; Pagoda's health check is merged in separately, as users do), argocd-secret, argocd-rbac-cm and the
    `default` AppProject (any repository, any destination, every kind)."""

    def meta(name: str, **labels: str) -> dict[str, Any]:
        return {"name": name, "namespace": NAMESPACE, "labels": {**PART_OF, **labels}}

    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("argocd-cm", **{"app.kubernetes.io/name": "argocd-cm"}),
            "data": {"timeout.reconciliation": f"{RESYNC_SECONDS}s"},
        },
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": meta("argocd-secret", **{"app.kubernetes.io/name": "argocd-secret"}),
            "type": "Opaque",
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta("argocd-rbac-cm", **{"app.kubernetes.io/name": "argocd-rbac-cm"}),
        },
        {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "AppProject",
            "metadata": {"name": "default", "namespace": NAMESPACE},
            "spec": {
                "sourceRepos": ["*"],
                "destinations": [{"namespace": "*", "server": "*"}],
                "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
            },
        },
    ]


# --- the Git repository -------------------------------------------------------------------------------


@dataclass
class GitRepo:
    """A local Git repository (branch main) that Argo CD reads through its file:// URL."""

    path: Path

    @property
    def url(self) -> str:
        return f"file://{self.path}"

    def git(self, *args: str) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "Platform Team",
            "GIT_AUTHOR_EMAIL": "platform@example.com",
            "GIT_COMMITTER_NAME": "Platform Team",
            "GIT_COMMITTER_EMAIL": "platform@example.com",
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
        }
        result = subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, env=env, timeout=60
        )
        if result.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed: {result.stderr}")
        return result.stdout.strip()

    @classmethod
    def create(cls, path: Path) -> GitRepo:
        path.mkdir(parents=True, exist_ok=True)
        repo = cls(path)
        repo.git("init", "--quiet", "--initial-branch=main")
        return repo

    def commit(self, files: dict[str, str | None], message: str) -> str:
        """Writes (or, for None, removes) the files, commits them all; returns the commit's SHA."""
        for name, text in files.items():
            target = self.path / name
            if text is None:
                self.git("rm", "--quiet", "-r", name)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
            self.git("add", name)
        self.git("commit", "--quiet", "-m", message)
        return self.git("rev-parse", "HEAD")

    def copy_tree(self, source: Path, name: str) -> None:
        """Copies a folder of the working tree (e.g. charts/pagoda) into the repository, uncommitted."""
        shutil.copytree(source, self.path / name, dirs_exist_ok=True)
        self.git("add", name)


# --- the processes ------------------------------------------------------------------------------------


@dataclass
class ArgoCD:
    cluster: Cluster
    redis: ComponentProcess
    repo_server: ComponentProcess
    controller: ComponentProcess
    redis_port: int
    repo_server_port: int
    repo_server_metrics_port: int
    controller_metrics_port: int

    def stop(self) -> None:
        for proc in (self.controller, self.repo_server, self.redis):
            proc.stop()

    def __enter__(self) -> ArgoCD:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def check_alive(self) -> None:
        for proc in (self.redis, self.repo_server, self.controller):
            proc.check_alive()

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return _kubectl(self.cluster, *args, input=input)

    def apply_application(self, app: dict[str, Any]) -> None:
        self.kubectl("apply", "--filename=-", input=yaml.safe_dump(app))

    def application(self, name: str) -> dict[str, Any]:
        """The live Application: its status is what Argo CD reports (sync, health, resources)."""
        self.check_alive()
        found: dict[str, Any] = json.loads(
            self.kubectl("get", "application", name, "-n", NAMESPACE, "-o", "json")
        )
        return found

    def refresh(self, name: str) -> None:
        """Asks for a refresh now, as a Git webhook does (the annotation the CLI's --refresh sets)."""
        self.kubectl(
            "annotate",
            "--overwrite",
            "application",
            name,
            "-n",
            NAMESPACE,
            "argocd.argoproj.io/refresh=normal",
        )


def _env(cluster: Cluster, workdir: Path, component: str) -> dict[str, str]:
    """The Procfile's environment: fake in-cluster config (the kubeconfig), data paths in workdir, helm and
    git on PATH, no GPG."""
    data = workdir / "data"
    for sub in ("tls", "ssh", "gpg/keys", "gpg/source", "home", "tmp"):
        (data / sub).mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env.update(
        ARGOCD_FAKE_IN_CLUSTER="true",
        KUBECONFIG=str(cluster.kubeconfig),
        PATH=f"{cluster.bin_dir}{os.pathsep}{env.get('PATH', '')}",
        HOME=str(data / "home"),
        TMPDIR=str(data / "tmp"),
        HOSTNAME=f"{component}-0",
        ARGOCD_TLS_DATA_PATH=str(data / "tls"),
        ARGOCD_SSH_DATA_PATH=str(data / "ssh"),
        ARGOCD_GNUPGHOME=str(data / "gpg/keys"),
        ARGOCD_GPG_DATA_PATH=str(data / "gpg/source"),
        ARGOCD_GPG_ENABLED="false",
        GIT_CONFIG_NOSYSTEM="1",
    )
    env.pop("REDIS_PASSWORD", None)
    return env


def start_argocd(cluster: Cluster, workdir: Path, *, timeout: float = START_TIMEOUT) -> ArgoCD:
    """Applies Argo CD's CRDs and settings (Pagoda's health check merged into argocd-cm with the patch
    docs/gitops.md gives users), starts Redis, the repo server and the application controller, and returns
    once they all answer. On any failure, stops what it started and raises StartError."""
    redis_exe = check_argocd_files(cluster.bin_dir)
    deadline = time.monotonic() + timeout
    log_dir = workdir / "logs"
    redis_port, repo_port, repo_metrics, controller_metrics = free_ports(4)
    redis = ComponentProcess("redis-server", redis_exe.parent, log_dir, detach=False)
    repo_server = ComponentProcess("argocd-repo-server", cluster.bin_dir, log_dir, detach=False)
    controller = ComponentProcess("argocd-application-controller", cluster.bin_dir, log_dir, detach=False)
    repo_server.exe = controller.exe = cluster.bin_dir / "argocd"
    argocd = ArgoCD(
        cluster, redis, repo_server, controller, redis_port, repo_port, repo_metrics, controller_metrics
    )
    try:
        install_crds(cluster, ARGOCD_CRD_FILES, max(deadline - time.monotonic(), 1))
        _kubectl(cluster, *APPLY, "--filename=-", input=yaml.safe_dump_all(settings_objects()))
        # Exactly what docs/gitops.md tells users to run.
        _kubectl(
            cluster,
            "-n",
            NAMESPACE,
            "patch",
            "configmap",
            "argocd-cm",
            "--type",
            "merge",
            f"--patch-file={EXAMPLES / 'argocd-cm.yaml'}",
        )
        (workdir / "redis").mkdir(parents=True, exist_ok=True)
        redis.start(
            [
                "--bind",
                "127.0.0.1",
                "--port",
                str(redis_port),
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir / "redis"),
            ],
        )
        wait_while_running(lambda: listens(redis_port), "redis-server's port", [redis], deadline)
        redis_addr = f"127.0.0.1:{redis_port}"
        repo_server.start(
            [
                "repo-server",
                f"--port={repo_port}",
                "--address=127.0.0.1",
                f"--metrics-port={repo_metrics}",
                "--metrics-address=127.0.0.1",
                "--client-ca-path=",  # its default (a path in the image) refuses --disable-tls
                f"--redis={redis_addr}",
                "--disable-tls",
                "--logformat=text",
            ],
            env=_env(cluster, workdir, "argocd-repo-server"),
        )
        wait_while_running(
            lambda: listens(repo_port), "argocd-repo-server's port", [redis, repo_server], deadline
        )
        controller.start(
            [
                "application-controller",
                f"--redis={redis_addr}",
                f"--repo-server=127.0.0.1:{repo_port}",
                "--repo-server-plaintext",
                f"--metrics-port={controller_metrics}",
                f"--namespace={NAMESPACE}",
                f"--app-resync={RESYNC_SECONDS}",
                "--app-resync-jitter=0",
                "--status-processors=4",
                "--operation-processors=2",
                "--logformat=text",
                "--commit-server=127.0.0.1:1",
                # Keep each resource's health in the Application's status.resources (v3's default keeps it
                # only in the resource tree, which only the API server serves).
                "--persist-resource-health=true",
            ],
            env=_env(cluster, workdir, "argocd-application-controller"),
        )
        wait_while_running(
            lambda: listens(controller_metrics),
            "argocd-application-controller's metrics port",
            [redis, repo_server, controller],
            deadline,
        )
    except BaseException:
        argocd.stop()
        raise
    return argocd
