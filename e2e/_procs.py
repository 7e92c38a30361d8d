"""Processes of the local control plane: ports, command lines, launching with logs, waiting, stopping."""

from __future__ import annotations

import ctypes
import os
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from e2e._pki import FRONT_PROXY_CLIENT, Pki
from e2e.podnet import FAKE_POD_CIDR
from e2e.processes import http_ok, wait_until

POLL = 0.1
STOP_GRACE = 10.0
SERVICE_CIDR = "10.96.0.0/16"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node=fake"
REPO_ROOT = Path(__file__).resolve().parents[1]
# Components that are harness code run by this Python (`python -m MODULE`), not Go binaries in bin_dir.
PYTHON_COMPONENTS = {
    "monitoring": "e2e.monitoring",
    "pagoda-operator": "pagoda.operator.main",  # `make cluster-up` runs the operator too
}


class StartError(RuntimeError):
    """A component exited or did not become ready in time."""


def write_kubeconfig(
    path: Path,
    server: str,
    pki: Pki,
    user: str = "pagoda-admin",
    cert: Path | None = None,
    key: Path | None = None,
) -> None:
    """A kubeconfig for `server` with a client certificate: the admin's, or `cert`/`key` as `user`."""
    path.write_text(
        f"""apiVersion: v1
kind: Config
clusters:
- name: pagoda-local
  cluster:
    server: {server}
    certificate-authority: {pki.ca_cert}
users:
- name: {user}
  user:
    client-certificate: {cert or pki.admin_cert}
    client-key: {key or pki.admin_key}
contexts:
- name: pagoda-local
  context: {{cluster: pagoda-local, user: {user}}}
current-context: pagoda-local
"""
    )


def component_args(
    workdir: Path,
    bin_dir: Path,
    pki: Pki,
    kubeconfig: Path,
    etcd_port: int,
    peer_port: int,
    api_port: int,
    kcm_port: int,
    sched_port: int,
    api_address: str = "127.0.0.1",
) -> dict[str, list[str]]:
    """Command-line arguments of each component, in start order. `api_address`: where kube-apiserver
    serves; loopback, or a real node's bridge address, where that node's pods reach it through the
    `kubernetes` Service (e2e/realnode.py)."""
    # Endpoints may not carry a loopback address: then the `kubernetes` Service gets none.
    reconciler = ["--endpoint-reconciler-type=none"] if api_address == "127.0.0.1" else []
    peer = f"http://127.0.0.1:{peer_port}"
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    delegated = [f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}"]
    delegated += [
        f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
    ]
    return {
        "etcd": [
            "--name=pagoda",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=pagoda={peer}",
            "--unsafe-no-fsync",
            "--log-level=warn",
        ],
        "kube-apiserver": [
            f"--etcd-servers={etcd_url}",
            f"--bind-address={api_address}",
            f"--advertise-address={api_address}",
            f"--secure-port={api_port}",
            f"--cert-dir={workdir / 'kube-apiserver'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            "--authorization-mode=Node,RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            *reconciler,
            # Towards kubelets (logs, exec, port-forward): a client certificate, and theirs checked.
            f"--kubelet-client-certificate={pki.kubelet_client_cert}",
            f"--kubelet-client-key={pki.kubelet_client_key}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
            "--allow-privileged=true",
            "--profiling=false",
            # The aggregation layer (APIService objects, e.g. KEDA's external metrics): the API server proxies
            # as the front-proxy client and passes the user on in these headers, which extension API servers
            # trust from that certificate only. Aggregator routing off (the default): the API server dials
            # the Service, not its endpoints, so an ExternalName Service can name an add-on on loopback
            # (e2e/addons.py).
            f"--requestheader-client-ca-file={pki.front_proxy_ca_cert}",
            f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={pki.front_proxy_client_cert}",
            f"--proxy-client-key-file={pki.front_proxy_client_key}",
            "--enable-aggregator-routing=false",
        ],
        "kube-controller-manager": [
            *delegated,
            f"--secure-port={kcm_port}",
            f"--cert-dir={workdir / 'kube-controller-manager'}",
            f"--service-account-private-key-file={pki.sa_key}",
            f"--root-ca-file={pki.ca_cert}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--profiling=false",
            # HPAs (KEDA's ScaledObjects make them) are evaluated every 5s instead of 15s.
            "--horizontal-pod-autoscaler-sync-period=5s",
        ],
        "kube-scheduler": [
            *delegated,
            f"--secure-port={sched_port}",
            f"--cert-dir={workdir / 'kube-scheduler'}",
            "--profiling=false",
        ],
        "kwok": [
            f"--kubeconfig={kubeconfig}",
            f"--config={bin_dir / 'kwok-stages.yaml'}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}",
            f"--cidr={FAKE_POD_CIDR}",
            "--node-lease-duration-seconds=40",
        ],
    }


def _die_with_parent() -> None:
    """In the child: get SIGKILL when the parent (the test session) exits, however it exits. (Not SIGTERM:
    kube-apiserver's graceful shutdown can hang once etcd is gone, and the data is thrown away anyway.)"""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Launcher:
    """Starts components with their output in LOG_DIR/NAME.log and watches that they stay up."""

    def __init__(self, bin_dir: Path, log_dir: Path, *, detach: bool) -> None:
        self.bin_dir = bin_dir
        self.log_dir = log_dir
        self.detach = detach
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.launched: dict[str, tuple[list[str], dict[str, str] | None]] = {}  # name -> (args, env)
        log_dir.mkdir(parents=True, exist_ok=True)

    def launch(self, name: str, args: list[str], env: dict[str, str] | None = None) -> int:
        """Starts component `name` with `args` (a binary in bin_dir, or `python -m MODULE` for the harness's
        own components, run from the repository root) and `env` (default: this process'); returns its PID."""
        argv = [str(program(self.bin_dir, name)), *args]
        if name in PYTHON_COMPONENTS:
            argv[1:1] = ["-m", PYTHON_COMPONENTS[name]]
        with open(self.log_dir / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
                start_new_session=True,
                preexec_fn=None if self.detach else _die_with_parent,
            )
        self.procs[name] = proc
        self.launched[name] = (args, env)
        return proc.pid

    def relaunch(self, name: str) -> int:
        """Stops component `name` (SIGTERM, SIGKILL after the grace period) and starts it again with the
        arguments and environment it was launched with, as a restarted static pod or systemd unit would
        be; its log goes on in the same file. Returns the new PID."""
        args, env = self.launched[name]
        terminate(self.procs.pop(name).pid, program(self.bin_dir, name))
        return self.launch(name, args, env)

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise StartError(f"{name} exited with code {proc.returncode}:\n{self.log_tail(name)}")

    def wait(self, probe: Callable[[], bool], what: str, deadline: float, log_of: str | None = None) -> None:
        """`processes.wait_until` until `deadline` (monotonic), failing at once with StartError when any
        component exits, and with the end of `log_of`'s log on timeout."""
        wait_until(
            probe,
            what,
            timeout=deadline - time.monotonic(),
            interval=POLL,
            alive=self.check_alive,
            tail=(lambda: self.log_tail(log_of)) if log_of else None,
            error=StartError,
        )

    def log_tail(self, name: str, lines: int = 30) -> str:
        text = (self.log_dir / f"{name}.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


def wait_http(launcher: Launcher, name: str, url: str, deadline: float, pki: Pki | None = None) -> None:
    """Waits until `url` answers 200 (the component's /readyz or /healthz)."""
    if pki is not None:
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    else:  # self-signed serving certificates that the component made for itself
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE

    launcher.wait(lambda: http_ok(url, context=ctx), f"{name} at {url}", deadline, log_of=name)


def _exe_matches(pid: int, exe: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/exe") == str(exe.resolve())
    except OSError:
        return False


def _gone(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # reaps it when it is our child
        if done:
            return True
    except ChildProcessError:
        pass
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state in ("Z", "X")


def all_alive(pids: dict[str, int], bin_dir: Path) -> bool:
    return bool(pids) and all(_exe_matches(pid, program(bin_dir, name)) for name, pid in pids.items())


def program(bin_dir: Path, name: str) -> Path:
    """The executable of component `name`: a binary in bin_dir, or this Python for the harness's own."""
    return Path(sys.executable) if name in PYTHON_COMPONENTS else bin_dir / name


def terminate(pid: int, exe: Path) -> None:
    """SIGTERM, then SIGKILL after a grace period, to `pid` only if it still runs `exe` (a process
    started by an earlier `python -m e2e up`)."""
    if not _exe_matches(pid, exe):
        return
    try:
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        while not _gone(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                deadline = float("inf")
            time.sleep(POLL / 2)
    except ProcessLookupError:
        return
