"""A real local Kubernetes control plane: etcd, kube-apiserver (RBAC on), kube-controller-manager,
kube-scheduler and kwok with two fake GPU nodes, all built by e2e/lab/tools/build.sh; with `real_node`, also
the local registry and a real node (kubelet, containerd, kube-proxy: e2e/lab/realnode.py) whose pods run
Pagoda's images.

    python -m e2e.lab up      # detached; kubeconfig at .pagoda-dev/kubeconfig (e2e/lab/__main__.py)
    python -m e2e.lab down

Tests use e2e/fixtures.py, which starts a private instance of the same cluster in a temp dir.
Every process started is recorded by PID (the state file in the workdir) and `stop()` ends exactly those.
`Cluster.add_node()` adds a second real node (pagoda-kubelet-1) to a running cluster with a real node, and
`remove_node` takes it away again; `start(..., nodes=2)` starts with both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.lab import _objects, images, podnet, realnode, registry
from e2e.lab._pki import FRONT_PROXY_CLIENT, Pki, write_kubeconfig, write_pki
from e2e.lab.processes import (
    REPO_ROOT,
    ComponentProcess,
    Launcher,
    StartError,
    discard_folder,
    free_ports,
    http_ok,
    program,
    terminate,
)

DEV_DIR = REPO_ROOT / ".pagoda-dev"
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "helm")
REAL_NODE_BINARIES = (
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "kubelet",
    "kube-proxy",
    "kube-network-policies",
    "coredns",
    "registry",
    "cni/bridge",
    "cni/host-local",
    "cni/loopback",
)
CRD_FILES = (
    "keda.sh_scaledobjects.yaml",
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
)
GPU_NODES = ("gpu-node-0", "gpu-node-1")
OPERATOR_RELEASE, OPERATOR_NAMESPACE = "pagoda", "pagoda-system"  # what `up` installs with Helm
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
START_TIMEOUT = 120.0
STATE_FILE = "state.json"


class ToolsMissingError(RuntimeError):
    """The Go-built binaries are not where the harness looks for them."""


def default_bin_dir() -> Path:
    return Path(os.environ.get("PAGODA_BIN") or DEV_DIR / "bin").resolve()


def check_bin_dir(bin_dir: Path, real_node: bool = False) -> None:
    binaries = BINARIES + (REAL_NODE_BINARIES if real_node else ())
    missing = [name for name in binaries if not os.access(bin_dir / name, os.X_OK)]
    missing += [f"crds/{name}" for name in CRD_FILES if not (bin_dir / "crds" / name).is_file()]
    if not (bin_dir / "kwok-stages.yaml").is_file():
        missing.append("kwok-stages.yaml")
    if missing:
        raise ToolsMissingError(
            f"The local control plane's binaries are missing from {bin_dir} (PAGODA_BIN): "
            f"{', '.join(missing)}. Run `make tools` (it runs e2e/lab/tools/build.sh .pagoda-dev/bin)."
        )


@dataclass
class Cluster:
    """A running control plane. `kubeconfig` is an admin kubeconfig for `server`."""

    workdir: Path
    bin_dir: Path
    kubeconfig: Path
    server: str
    pids: dict[str, int] = field(default_factory=dict)
    urls: dict[str, str] = field(default_factory=dict)  # the add-ons' endpoints, for people
    node: realnode.NodeNetwork | None = None  # the real node's network, when this cluster has one
    # Real nodes beside node 0 (add_node): name -> its network, and name -> component -> PID. Apart from
    # `pids`, whose names are the components' (a second node's containerd is `containerd` too).
    more_nodes: dict[str, realnode.NodeNetwork] = field(default_factory=dict)
    node_pids: dict[str, dict[str, int]] = field(default_factory=dict)
    _launcher: Launcher | None = field(default=None, repr=False, compare=False)
    _pki: Pki | None = field(default=None, repr=False, compare=False)  # to sign a new node's certificates
    _node_launchers: dict[str, Launcher] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path, bin_dir: Path | None = None) -> Cluster:
        """A cluster someone else runs (`python -m e2e.lab up`); `stop()` leaves it running."""
        config = yaml.safe_load(kubeconfig.read_text())
        current = config.get("current-context")
        context = next(c["context"] for c in config["contexts"] if c["name"] == current)
        server = next(c["cluster"]["server"] for c in config["clusters"] if c["name"] == context["cluster"])
        return cls(
            workdir=kubeconfig.parent,
            bin_dir=bin_dir or default_bin_dir(),
            kubeconfig=kubeconfig,
            server=server,
        )

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def kubectl(
        self, *args: str, check: bool = True, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            error = subprocess.CalledProcessError(proc.returncode, cmd, proc.stdout, proc.stderr)
            error.add_note(f"kubectl said: {proc.stderr.strip()[-2000:]}")  # a test's report shows why
            raise error
        return proc

    def rollout_status(self, namespace: str, deployment: str, timeout: float) -> None:
        """Waits until the Deployment's rollout is complete (`kubectl rollout status`): every replica of its
        current template updated and Ready. Raises CalledProcessError, with kubectl's reason, otherwise."""
        self.kubectl(
            "rollout",
            "status",
            "-n",
            namespace,
            f"deployment/{deployment}",
            f"--timeout={max(1, int(timeout))}s",
            timeout=timeout + 10,
        )

    def restart(self, name: str, timeout: float = 120.0) -> float:
        """Restarts control-plane component `name` (etcd, kube-apiserver, ...) the way a node upgrade or a
        crash does: SIGTERM (SIGKILL after the grace period), then the same command again. Waits until the API
        server is ready once more (its /readyz checks etcd too) and returns the seconds it was unready."""
        launcher = self._launcher
        if launcher is None:
            raise RuntimeError("restart needs the cluster this process started (not one it attached to)")
        began = time.monotonic()
        self.pids[name] = launcher.relaunch(name)
        self.save_state()
        launcher.wait(
            lambda: self.kubectl("get", "--raw=/readyz", check=False, timeout=10).returncode == 0,
            f"the API server to be ready after restarting {name}",
            began + timeout,
            log_of=name,
        )
        return time.monotonic() - began

    @property
    def real_nodes(self) -> list[realnode.NodeNetwork]:
        """Every real node's network, node 0 first."""
        return ([self.node] if self.node is not None else []) + list(self.more_nodes.values())

    def add_node(self, timeout: float = 120.0, prepull: str | None = None) -> realnode.RealNode:
        """Adds the next real node (pagoda-kubelet-1, ...) to this running cluster with a real node: its own
        bridge and /24, containerd and kubelet (e2e/lab/realnode.py start_extra), pulling from the same
        registry; node 0's kube-proxy, CoreDNS and NetworkPolicy agent serve it too. Returns once the node is
        Ready with its GPUs; with `prepull`, the kubelet then pulls that image in the background (each node's
        containerd has a store of its own: the 7 GB runtime image costs minutes, so only on request)."""
        if self.node is None or self._pki is None or "registry" not in self.urls:
            raise RuntimeError(
                "add_node needs a cluster with a real node that this process started (it signs the new "
                "node's certificates with the cluster CA); for `make cluster-up` use `up --nodes 2`."
            )
        taken = {net.index for net in self.more_nodes.values()}
        index = next(i for i in range(1, len(taken) + 2) if i not in taken)  # the lowest free, from 1
        launcher = self._launcher
        detach = launcher.detach if launcher is not None else True
        network = realnode.NodeNetwork.create_extra(self.node, index)
        name = network.name
        self.more_nodes[name], self.node_pids[name] = network, {}
        self._node_launchers[name] = Launcher(self.bin_dir, self.workdir / "logs" / name, detach=detach)
        self.save_state()
        try:
            node = realnode.start_extra(
                self,
                self._node_launchers[name],
                network,
                self._pki,
                self.urls["registry"],
                self.node_pids[name],
                time.monotonic() + timeout,
            )
        except BaseException:
            self.remove_node(name)
            raise
        if prepull is not None:
            realnode.prepull(self, prepull, name)
        return node

    def lose_node(self, name: str) -> None:
        """Node `name` (one add_node made) fails as a machine losing its power does (realnode.power_off): its
        link goes down, its kubelet, containerd and every container die by SIGKILL, and nothing tells the
        API server, which learns it as a cluster does: the node's lease runs out (the controller manager's
        node-monitor grace period), the node goes Unknown and NotReady, its pods' endpoints go, and its
        pods are evicted once their `node.kubernetes.io/unreachable` toleration runs out. `remove_node`
        takes what is left away."""
        network = self.more_nodes[name]
        pids = self.node_pids[name]
        realnode.power_off(network, pids)
        pids.clear()  # dead: remove_node neither drains through its kubelet nor stops them
        self.save_state()

    def remove_node(self, name: str) -> None:
        """Takes node `name` (one add_node made) away while the cluster runs on: cordoned, its pods deleted
        while its kubelet still runs (replacements go to the other nodes), its kubelet and containerd ended
        by PID, everything it made on the machine removed (realnode.teardown) and its Node object deleted.
        Node 0's pods and Services go on being served throughout."""
        network = self.more_nodes.get(name)
        if network is None:
            return
        pids = self.node_pids.get(name, {})
        if "kubelet" in pids:
            self.kubectl("cordon", name, check=False)
            realnode.drain(self, node=name)
        launcher = self._node_launchers.pop(name, None)
        own = launcher.procs if launcher else {}
        for component in reversed(list(pids)):
            if component in own:
                own[component].stop()
            else:  # started by an earlier `python -m e2e.lab up`
                terminate(pids[component], ComponentProcess.STOP_GRACE, program(self.bin_dir, component))
        realnode.teardown(network, self.bin_dir)
        self.kubectl("delete", "node", name, "--ignore-not-found", check=False)
        if "kubelet" not in pids:  # a lost node: no kubelet will ever confirm its pods' end
            self.kubectl(
                "delete",
                "pods",
                "--all-namespaces",
                f"--field-selector=spec.nodeName={name}",
                "--grace-period=0",
                "--force",
                check=False,
            )
        del self.more_nodes[name], self.node_pids[name]
        self.save_state()

    def stop(self) -> None:
        """Ends exactly the processes this cluster started (by PID), most dependent first, after the real
        node's pods were drained; then removes what the real node made (e2e/lab/realnode.py teardown).
        Second nodes go first (remove_node): node 0 runs what they share."""
        for name in list(self.more_nodes):
            self.remove_node(name)
        if not self.pids:
            return
        if self.node is not None and "kubelet" in self.pids:
            realnode.drain(self)  # while its kubelet still runs: each pod's preStop, SIGTERM, CNI teardown
        own = self._launcher.procs if self._launcher else {}
        kwok = self.pids.get("kwok")
        for name in reversed(list(self.pids)):
            if name in own:
                own[name].stop()
            else:  # started by an earlier `python -m e2e.lab up`
                terminate(self.pids[name], ComponentProcess.STOP_GRACE, program(self.bin_dir, name))
        self.pids.clear()
        if self.node is not None:
            realnode.teardown(self.node, self.bin_dir)
        podnet.release_pod_range(kwok)
        (self.workdir / STATE_FILE).unlink(missing_ok=True)

    def discard(self, failed: bool) -> None:
        """After `stop`: the cluster's folder goes, unless what ran on it failed; then its logs are kept, and
        named."""
        discard_folder(self.workdir, failed, "the local control plane's logs", self.workdir / "logs")

    def save_state(self) -> None:
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "bin_dir": str(self.bin_dir),
            "pids": self.pids,
            "urls": self.urls,
            "node": dataclasses.asdict(self.node) if self.node else None,
            "more_nodes": {
                name: {"network": dataclasses.asdict(net), "pids": self.node_pids.get(name, {})}
                for name, net in self.more_nodes.items()
            },
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def load_state(cls, workdir: Path) -> Cluster | None:
        path = workdir / STATE_FILE
        if not path.is_file():
            return None
        state = json.loads(path.read_text())
        more = state.get("more_nodes") or {}
        return cls(
            workdir=workdir,
            bin_dir=Path(state["bin_dir"]),
            kubeconfig=Path(state["kubeconfig"]),
            server=state["server"],
            pids={k: int(v) for k, v in state["pids"].items()},
            urls=state.get("urls", {}),
            node=realnode.NodeNetwork(**state["node"]) if state.get("node") else None,
            more_nodes={name: realnode.NodeNetwork(**entry["network"]) for name, entry in more.items()},
            node_pids={name: {k: int(v) for k, v in entry["pids"].items()} for name, entry in more.items()},
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
    `kubernetes` Service (e2e/lab/realnode.py)."""
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
            f"--service-cluster-ip-range={podnet.SERVICE_CIDR}",
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
            # (e2e/lab/addons.py).
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
            f"--service-cluster-ip-range={podnet.SERVICE_CIDR}",
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
            f"--manage-nodes-with-annotation-selector={_objects.FAKE_NODE_ANNOTATION}",
            f"--cidr={podnet.FAKE_POD_CIDR}",
            "--node-lease-duration-seconds=40",
        ],
    }


def start_registry(cluster: Cluster, launcher: Launcher, timeout: float = 30.0) -> str:
    """Runs the local registry (e2e/lab/registry.py) and pushes `make images`' images and the chart; returns
    host:port."""
    port = registry.choose_port()
    # Its OpenTelemetry exporter is on by default and would post traces to localhost:4318 every few seconds.
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "none"}
    cluster.pids["registry"] = launcher.launch("registry", registry.args(cluster.workdir, port), env=env)
    cluster.save_state()
    address = f"127.0.0.1:{port}"
    launcher.wait(
        lambda: http_ok(f"http://{address}/v2/"), "the registry", time.monotonic() + timeout, "registry"
    )
    registry.record_pushed(cluster.workdir, registry.push_images(address))
    cluster.urls["chart"] = registry.push_chart(address, cluster.bin_dir / "helm", cluster.workdir)
    cluster.urls["registry"] = address
    return address


def start_real_node(
    cluster: Cluster,
    launcher: Launcher,
    network: realnode.NodeNetwork,
    pki: Any,
    timeout: float = 120.0,
) -> None:
    """The registry, then the real node; returns when the node is Ready, with the CPU runtime image being
    pulled onto it in the background (`realnode.prepull`)."""
    address = start_registry(cluster, launcher)
    realnode.start(cluster, launcher, network, pki, address, time.monotonic() + timeout)
    cluster.save_state()
    realnode.prepull(cluster, images.runtime_cpu_image())


def start(
    workdir: Path,
    bin_dir: Path | None = None,
    *,
    detach: bool = False,
    timeout: float = START_TIMEOUT,
    real_node: bool = False,
    nodes: int = 1,
) -> Cluster:
    """Starts every component, then waits until the API serves, controllers and scheduler are healthy,
    the fake GPU nodes are Ready and the third-party CRDs are Established. With `real_node`, also the local
    registry (with `make images`' images pushed) and a kubelet + containerd node (e2e/lab/realnode.py); the
    API server then serves on that node's bridge address, where its pods reach it. `nodes`: how many real
    nodes (the ones after the first: Cluster.add_node, with the runtime image pre-pulled on each)."""
    bin_dir = (bin_dir or default_bin_dir()).resolve()
    check_bin_dir(bin_dir, real_node)
    if nodes > 1 and not real_node:
        raise ValueError("A second real node needs the first (real_node=True).")
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    network = realnode.NodeNetwork.create(workdir) if real_node else None
    api_address = network.address if network else "127.0.0.1"
    try:
        pki = write_pki(workdir / "pki", extra_ips=(api_address,) if network else ())
    except BaseException:
        if network:
            network.down()
        raise
    etcd_port, peer_port, api_port, kcm_port, sched_port = free_ports(5)
    server = f"https://{api_address}:{api_port}"
    kubeconfig = workdir / "admin.kubeconfig"
    write_kubeconfig(kubeconfig, server, pki)
    launcher = Launcher(bin_dir, workdir / "logs", detach=detach)
    cluster = Cluster(
        workdir, bin_dir, kubeconfig, server, _launcher=None if detach else launcher, node=network, _pki=pki
    )
    deadline = time.monotonic() + timeout
    try:
        for name, args in component_args(
            workdir,
            bin_dir,
            pki,
            kubeconfig,
            etcd_port,
            peer_port,
            api_port,
            kcm_port,
            sched_port,
            api_address,
        ).items():
            cluster.pids[name] = launcher.launch(name, args)
            cluster.save_state()
            if name == "kwok":  # its fake pods' addresses must end on this host
                podnet.guard_pod_range(cluster.pids[name])
            if name == "kube-apiserver":  # the controllers exit when their first call is refused
                launcher.wait_http("kube-apiserver", f"{server}/readyz", deadline, pki=pki)
        api = cluster.api_client()
        try:
            crds = _objects.create_crds(api, bin_dir / "crds", CRD_FILES)
            for i, node in enumerate(GPU_NODES):
                ip = f"10.254.0.{i + 1}"
                _objects.create_fake_gpu_node(api, node, GPU_PRODUCT, ip, tainted=real_node)
            launcher.wait_http("kube-controller-manager", f"https://127.0.0.1:{kcm_port}/healthz", deadline)
            launcher.wait_http("kube-scheduler", f"https://127.0.0.1:{sched_port}/healthz", deadline)
            _objects.wait_crds_established(launcher, api, crds, deadline)
            _objects.wait_nodes_ready(launcher, api, GPU_NODES, deadline)
            _objects.wait_service_account(launcher, api, "default", deadline)
        finally:
            api.close()
        if network is not None:
            start_real_node(cluster, launcher, network, pki)
        for _ in range(nodes - 1):
            cluster.add_node(prepull=images.runtime_cpu_image())
    except BaseException:
        cluster.stop()
        raise
    return cluster


def install_operator(
    cluster: Cluster,
    release: str = OPERATOR_RELEASE,
    namespace: str = OPERATOR_NAMESPACE,
    values: tuple[str, ...] = (),
    timeout: float = 240.0,
    version: str | None = None,
    runtime_image: str | None = None,
) -> None:
    """Installs Pagoda as a user does: `helm install` of the chart from the local registry (oci://), waiting
    for it. The operator runs as a pod on the real node, from its image, under the chart's RBAC; its services
    run the CPU runtime image (the chart's `operator.runtimeImage`). `values`: more `--set` arguments;
    `version`, `runtime_image`: an earlier release's chart and CPU runtime (e2e/lab/releases.py) instead of
    this checkout's."""
    args = [
        str(cluster.bin_dir / "helm"),
        f"--kubeconfig={cluster.kubeconfig}",
        "install",
        release,
        cluster.urls["chart"],
        f"--version={version or registry.chart_version()}",
        "--plain-http",
        f"--namespace={namespace}",
        "--create-namespace",
        f"--set=operator.runtimeImage={runtime_image or images.runtime_cpu_image()}",
        *(f"--set={value}" for value in values),
        "--wait",
        f"--timeout={timeout:.0f}s",
    ]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout + 30)
    if proc.returncode != 0:
        raise StartError(f"helm install {release} failed:\n{proc.stdout}{proc.stderr}")
    cluster.urls["helm release"] = f"{namespace}/{release} (operator.runtimeImage: CPU)"


def start_private(bin_dir: Path | None = None, *, real_node: bool = False) -> Cluster:
    """A cluster in a fresh temp dir, for tests; its processes die with the calling process."""
    return start(Path(tempfile.mkdtemp(prefix="pagoda-cluster-")), bin_dir, real_node=real_node)
