"""A real Kubernetes node on this machine: containerd (from its Go module) with Debian's runc, the CNI
bridge, host-local and loopback plugins, and kubelet and kube-proxy from the pinned Kubernetes, all built by
e2e/lab/tools/build.sh. Its pods run from OCI images pulled from the local registry (e2e/lab/registry.py),
with their securityContext and resource limits enforced by runc and the kernel; Services work through
kube-proxy (nftables mode), their names resolve through CoreDNS (e2e/lab/clusterdns.py), and NetworkPolicies
are enforced by kube-network-policies (SIG Network's agent, e2e/lab/tools/netpol: the first packet of each
connection to a pod goes to it through NFQUEUE). Only the GPU is simulated: the node
advertises `nvidia.com/gpu` as a node-level extended resource (the one fake), so that Pagoda's GPU pods
schedule here unchanged.

    network = NodeNetwork.create()        # before kube-apiserver, which serves on network.address
    node = RealNode.start(cluster, launcher, network, registry, deadline)
    node.stop()                           # pods, processes, mounts, cgroups, links, nftables: all gone

No packet leaves the machine:
- pods get an address on the node's bridge and routes for the pod and Service ranges only, never a default
  route; the host routes the pod range `unreachable` (only the bridge's /24 is more specific) and the
  Service range to a local sink device (`ifb`: this kernel has no `dummy`), so a ClusterIP without a
  kube-proxy rule ends on this host;
- an nftables table of the harness's own drops anything from the pod or Service ranges, or forwarded from a
  harness bridge, that would leave by an interface other than loopback or the harness's own links;
- containerd sends every registry (its catch-all `_default` host) to the local registry, so a missing image
  fails at once with ErrImagePull instead of a lookup elsewhere.

One real node per machine at a time: kube-proxy's and kube-network-policies' nftables tables (and the
latter's NFQUEUE number) are fixed, so a second node's would rewrite the first one's. `NodeNetwork.create`
refuses with the owner's workdir.

Names share the prefix `pgk` (links) and `pagoda-node-` (cgroups, nftables), with the node's id; a record
per node in RUN_DIR lets `sweep()` remove what a node whose processes died left behind.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from e2e.lab import _objects, _pki, clusterdns, podnet
from e2e.lab.processes import Launcher, free_ports

NODE_NAME = "pagoda-kubelet-0"
# The node is not tainted: kwok's simulated nodes are (e2e/lab/_objects.py KWOK_TAINT) when a real node runs,
# so a plain pod lands here and only pods that ask for simulation (the toleration, `type: kwok`) go there.
NODE_LABEL = "pagoda.dev/real-node"
GPU_CAPACITY = "4"  # the one fake: nvidia.com/gpu as a node-level extended resource
POD_RANGE = str(podnet.POD_RANGE)
SERVICE_RANGE = podnet.SERVICE_CIDR
RUNC = "/usr/sbin/runc"  # Debian's runc
SANDBOX_IMAGE = "registry.k8s.io/pause:3.10"  # built by `make images`, pulled from the local registry
RUN_DIR = Path("/run/pagoda-realnode")  # <id>.json: what each node made, for sweep()
LINK_PREFIX = podnet.BRIDGE_PREFIX
CNI_NETWORK = "pagoda"
# kubelet reaches iptables through PATH (to make its KUBE-FIREWALL and hint chains, for other components):
# without /usr/sbin it leaves the host's iptables alone. kube-proxy (nftables mode) and runc are named
# by absolute path or need nothing from there.
KUBELET_PATH = "/usr/local/bin:/usr/bin:/bin"
NODE_COMPONENTS = ("containerd", "kubelet", "kube-proxy", "kube-network-policies", "coredns")
# kube-network-policies' nftables tables: its controller's (inet; it cannot install it on a kernel without
# nftables' queue expression), and the one our main (e2e/lab/tools/netpol) queues with the xtables target
# instead (ip); and its client certificate's name.
NETPOL_TABLES = (("inet", "kube-network-policies"), ("ip", "pagoda-netpol-queue"))
NETPOL_USER = "system:kube-network-policies"
# What its informers read: pods (their labels and IPs), namespaces (their labels) and the policies. No Node
# informer: upstream's main makes one only for the admin network policies, which the harness does not enable.
NETPOL_RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": NETPOL_USER},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]},
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["get", "list", "watch"],
            },
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": NETPOL_USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NETPOL_USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": NETPOL_USER}],
    },
]


class NodeError(RuntimeError):
    """The real node could not be set up."""


def run(*argv: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, input=input)
    if check and proc.returncode != 0:
        raise NodeError(f"`{' '.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _cgroup_controllers() -> list[Path]:
    """The cgroup v1 hierarchies (one folder per mounted controller set) or the v2 root."""
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        return [root]
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink() and p.name != "unified")


@dataclass
class NodeNetwork:
    """The host side of the node: its bridge (pods' subnet and the node's address), the Service range's
    sink, the routes and the guard table. Made before kube-apiserver, which serves on `address`."""

    node_id: str
    subnet: str
    workdir: str
    owner_pid: int  # the harness process that made it (or containerd's, once `make cluster-up` detaches)

    @property
    def bridge(self) -> str:
        return f"{LINK_PREFIX}{self.node_id}b"

    @property
    def sink(self) -> str:
        return f"{LINK_PREFIX}{self.node_id}s"

    @property
    def table(self) -> str:
        return f"pagoda-node-{self.node_id}"

    @property
    def cgroup_root(self) -> str:
        return f"/pagoda-node-{self.node_id}"

    @property
    def address(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def record(self) -> Path:
        return RUN_DIR / f"{self.node_id}.json"

    @classmethod
    def create(cls, workdir: Path) -> NodeNetwork:
        sweep()
        for other in _records():
            raise NodeError(
                f"A real node already runs on this machine (workdir {other.workdir}, owner pid "
                f"{other.owner_pid}); one at a time (its nftables tables have fixed names). Stop it "
                "first (`make cluster-down` for the one of `make cluster-up`)."
            )
        net = cls(uuid.uuid4().hex[:6], str(podnet.free_subnet()), str(workdir), os.getpid())
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        net.save()
        try:
            net._up()
        except BaseException:
            net.down()
            raise
        return net

    def save(self) -> None:
        self.record.write_text(json.dumps(asdict(self)) + "\n")

    def _up(self) -> None:
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.address}/{prefix}", "dev", self.bridge)
        # Bridged replies between two pods of one bridge pass netfilter, so that a Service's DNAT is undone
        # (pod -> ClusterIP -> pod on the same node); and packets that arrive on the bridge may be routed
        # back out of it (that same hairpin). Nothing else is forwarded: the guard table drops it.
        run("ip", "link", "set", self.bridge, "type", "bridge", "nf_call_iptables", "1")
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/forwarding").write_text("1\n")
        run("ip", "link", "set", self.bridge, "up")
        run("ip", "link", "add", self.sink, "type", "ifb")
        run("ip", "link", "set", self.sink, "up")
        run("ip", "route", "replace", "unreachable", POD_RANGE)
        run("ip", "route", "replace", SERVICE_RANGE, "dev", self.sink, "src", self.address)
        ranges = f"{{ {POD_RANGE}, {SERVICE_RANGE} }}"
        own = f'oifname != "lo" oifname != "{LINK_PREFIX}*"'
        run(
            "nft",
            "-f",
            "-",
            input=f"""table inet {self.table} {{
  chain forward {{
    type filter hook forward priority 0; policy accept;
    iifname "{LINK_PREFIX}*" {own} counter drop
    ip saddr {ranges} {own} counter drop
  }}
  chain postrouting {{
    type filter hook postrouting priority 0; policy accept;
    ip saddr {ranges} {own} counter drop
    ip daddr {ranges} {own} counter drop
  }}
}}
""",
        )

    def guard_drops(self) -> int:
        """Packets the guard table dropped so far (each would otherwise have left by another interface)."""
        listing = json.loads(run("nft", "-j", "list", "table", "inet", self.table).stdout)
        total = 0
        for item in listing.get("nftables", []):
            for expr in item.get("rule", {}).get("expr", []):
                if "counter" in expr:
                    total += int(expr["counter"]["packets"])
        return total

    def down(self) -> None:
        """Removes the links, routes and table (the pods' veths went with their namespaces)."""
        run("nft", "delete", "table", "inet", self.table, check=False)
        run("ip", "route", "delete", SERVICE_RANGE, "dev", self.sink, check=False)
        for link in (self.sink, self.bridge):
            run("ip", "link", "delete", link, check=False)
        podnet.release_pod_range()
        for proto_range in ("-s", "-d"):
            for cidr in (POD_RANGE, SERVICE_RANGE):
                run("conntrack", "-D", proto_range, cidr, check=False)
        self.record.unlink(missing_ok=True)


def _records() -> list[NodeNetwork]:
    nets = []
    for path in sorted(RUN_DIR.glob("*.json")) if RUN_DIR.is_dir() else []:
        try:
            nets.append(NodeNetwork(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
    return nets


def sweep() -> list[str]:
    """Tears down every node whose owner is gone (a harness that was killed); returns their workdirs."""
    removed = []
    for net in _records():
        if not podnet.alive(net.owner_pid):
            teardown(net)
            removed.append(net.workdir)
    return removed


@dataclass
class NodePaths:
    """Where one node keeps its configuration and state (all under WORKDIR/node)."""

    root: Path

    @classmethod
    def under(cls, workdir: Path) -> NodePaths:
        return cls(workdir / "node")

    @property
    def resolv_conf(self) -> Path:
        """The cluster DNS's resolv.conf, for host processes that stand in for pods
        (clusterdns.in_cluster_dns)."""
        return self.root / "resolv.conf"

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd" / "state"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"


def _containerd_config(paths: NodePaths, bin_dir: Path) -> str:
    state = paths.root / "containerd"
    return f"""# containerd for the local real node (e2e/lab/realnode.py).
version = 3
root = "{state / "root"}"
state = "{paths.containerd_state}"
# NRI would listen on /var/run/nri; the opt plugin would create /opt/containerd.
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt"]

[grpc]
  address = "{paths.containerd_socket}"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{SANDBOX_IMAGE}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{state / "certs.d"}"

[plugins."io.containerd.cri.v1.runtime"]
  # Root here lacks CAP_SYS_RESOURCE: runc cannot lower a process' oom_score_adj, so sandboxes fail
  # ("can't get final child's PID from pipe") unless containerd keeps it at the parent's.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{bin_dir / "cni"}"]
    conf_dir = "{paths.root / "cni"}"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      BinaryName = "{RUNC}"
      Root = "{state / "runc"}"
      SystemdCgroup = false
"""


def _registry_hosts(registry: str) -> str:
    """certs.d/_default/hosts.toml: every registry is the local one, and only it (`server` names it, so
    containerd never falls back to the image's own registry)."""
    return f"""server = "http://{registry}"

[host."http://{registry}"]
  capabilities = ["pull", "resolve"]
"""


def _cni_config(net: NodeNetwork, paths: NodePaths) -> dict[str, Any]:
    return {
        "cniVersion": "1.0.0",
        "name": CNI_NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": net.bridge,
                "isGateway": False,  # the harness gave the bridge its address
                "ipMasq": False,
                "hairpinMode": True,  # a pod that reaches itself through its Service
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(paths.root / "cni-ipam"),
                    "ranges": [[{"subnet": net.subnet, "gateway": net.address}]],
                    # The pod and Service ranges through the node; no default route.
                    "routes": [{"dst": POD_RANGE}, {"dst": SERVICE_RANGE}],
                },
            },
            {"type": "loopback"},
        ],
    }


def _kubelet_config(
    net: NodeNetwork, paths: NodePaths, pki: _pki.Pki, port: int, healthz: int
) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": net.address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz,
        "tlsCertFile": str(paths.root / "kubelet.crt"),
        "tlsPrivateKeyFile": str(paths.root / "kubelet.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        # This machine has cgroup v1, which kubelet 1.36 refuses unless told; containerd 2 reports the
        # cgroupfs driver itself.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": net.cgroup_root,
        "failSwapOn": False,
        # Pods get the cluster's DNS (CoreDNS on the node's address), never the host's resolver.
        "clusterDNS": [net.address],
        "clusterDomain": clusterdns.CLUSTER_DOMAIN,
        "resolvConf": "",
        "podLogsDir": str(paths.root / "pod-logs"),
        "serializeImagePulls": False,
        # Shared, small disks: evict only when really full, and never collect images.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusReportFrequency": "10s",
        # How often each pod is synced, and so how soon a changed Secret or ConfigMap reaches its volume (a
        # renewed TLS certificate: e2e/test_tls.py). The default, 1 min, was most of that test's time.
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }


def _kube_proxy_config(net: NodeNetwork, paths: NodePaths, healthz: int, metrics: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "nftables",
        "clientConnection": {"kubeconfig": str(paths.root / "kube-proxy.kubeconfig")},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_RANGE,
        "bindAddress": net.address,
        "healthzBindAddress": f"127.0.0.1:{healthz}",
        "metricsBindAddress": f"127.0.0.1:{metrics}",
        "nodePortAddresses": [f"{net.address}/32"],
        # Its defaults would rewrite host sysctls (conntrack table size and TCP timeouts) and its own
        # oom_score_adj (refused here): leave the machine as it is.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": 0,
    }


@dataclass
class RealNode:
    """A running node: `name`, its network, and where its configuration and logs are."""

    network: NodeNetwork
    paths: NodePaths
    bin_dir: Path
    name: str = NODE_NAME
    healthz: dict[str, str] = field(default_factory=dict)  # component -> its /healthz on loopback

    @classmethod
    def configure(
        cls, workdir: Path, bin_dir: Path, network: NodeNetwork, pki: _pki.Pki, server: str, registry: str
    ) -> tuple[RealNode, dict[str, list[str]]]:
        """Writes every configuration file; returns the node and each component's arguments, in start
        order (NODE_COMPONENTS)."""
        paths = NodePaths.under(workdir)
        for sub in ("containerd/certs.d/_default", "cni", "cni-ipam", "kubelet", "pod-logs"):
            (paths.root / sub).mkdir(parents=True, exist_ok=True)
        (paths.root / "containerd.toml").write_text(_containerd_config(paths, bin_dir))
        (paths.root / "containerd/certs.d/_default/hosts.toml").write_text(_registry_hosts(registry))
        (paths.root / "cni" / f"10-{CNI_NETWORK}.conflist").write_text(
            json.dumps(_cni_config(network, paths), indent=2) + "\n"
        )
        root = paths.root
        _pki.issue_leaf(
            pki,
            root / "kubelet-client.crt",
            root / "kubelet-client.key",
            f"system:node:{NODE_NAME}",
            "system:nodes",
        )
        _pki.issue_leaf(
            pki,
            root / "kubelet.crt",
            root / "kubelet.key",
            f"system:node:{NODE_NAME}",
            "system:nodes",
            server_ips=(network.address,),
        )
        _pki.issue_leaf(pki, root / "kube-proxy.crt", root / "kube-proxy.key", "system:kube-proxy")
        _pki.write_kubeconfig(
            root / "kubelet.kubeconfig",
            server,
            pki,
            user=f"system:node:{NODE_NAME}",
            cert=root / "kubelet-client.crt",
            key=root / "kubelet-client.key",
        )
        _pki.write_kubeconfig(
            root / "kube-proxy.kubeconfig",
            server,
            pki,
            user="system:kube-proxy",
            cert=root / "kube-proxy.crt",
            key=root / "kube-proxy.key",
        )
        _pki.issue_leaf(pki, root / "coredns.crt", root / "coredns.key", clusterdns.USER)
        _pki.write_kubeconfig(
            root / "coredns.kubeconfig",
            server,
            pki,
            user=clusterdns.USER,
            cert=root / "coredns.crt",
            key=root / "coredns.key",
        )
        _pki.issue_leaf(
            pki, root / "kube-network-policies.crt", root / "kube-network-policies.key", NETPOL_USER
        )
        _pki.write_kubeconfig(
            root / "kube-network-policies.kubeconfig",
            server,
            pki,
            user=NETPOL_USER,
            cert=root / "kube-network-policies.crt",
            key=root / "kube-network-policies.key",
        )
        ports = free_ports(7)
        kubelet_port, kubelet_healthz, proxy_healthz, proxy_metrics, dns_health, dns_ready, np_port = ports
        (root / "Corefile").write_text(
            clusterdns.corefile(network.address, root / "coredns.kubeconfig", dns_health, dns_ready)
        )
        paths.resolv_conf.write_text(clusterdns.resolv_conf(network.address))
        (root / "kubelet.yaml").write_text(
            yaml.safe_dump(_kubelet_config(network, paths, pki, kubelet_port, kubelet_healthz))
        )
        (root / "kube-proxy.yaml").write_text(
            yaml.safe_dump(_kube_proxy_config(network, paths, proxy_healthz, proxy_metrics))
        )
        for hierarchy in _cgroup_controllers():  # kubelet wants its cgroup root to exist
            (hierarchy / network.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
        args = {
            "containerd": [f"--config={root / 'containerd.toml'}", "--log-level=warn"],
            "kubelet": [
                f"--config={root / 'kubelet.yaml'}",
                f"--kubeconfig={root / 'kubelet.kubeconfig'}",
                f"--root-dir={paths.kubelet_dir}",
                f"--cert-dir={root / 'kubelet-pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={network.address}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=1",
            ],
            "kube-proxy": [f"--config={root / 'kube-proxy.yaml'}", "--v=1"],
            "kube-network-policies": [
                f"--kubeconfig={root / 'kube-network-policies.kubeconfig'}",
                f"--hostname-override={NODE_NAME}",
                f"--metrics-bind-address=127.0.0.1:{np_port}",
                # NRI stays on, as upstream runs it: with it off, v0.8.0 looks an address that is no
                # known pod's up in a nil plugin. containerd's NRI is off here (_containerd_config), so
                # the plugin's dial fails once and the pod IPs come from the API server.
                "--fail-open=false",  # new connections to pods drop while no agent answers the queue
                # This kernel lacks nftables' queue expression (CONFIG_NFT_QUEUE), which the controller's own
                # table needs: our main queues with the xtables NFQUEUE target instead (e2e/lab/tools/netpol).
                f"--xt-queue-cidr={network.subnet}",
                "--v=1",
            ],
            "coredns": [f"-conf={root / 'Corefile'}"],
        }
        node = cls(network, paths, bin_dir)
        node.healthz = {
            "kubelet": f"http://127.0.0.1:{kubelet_healthz}/healthz",
            "kube-proxy": f"http://127.0.0.1:{proxy_healthz}/healthz",
            # Our main's (e2e/lab/tools/netpol): once its informers synced; it programs its table right after.
            "kube-network-policies": f"http://127.0.0.1:{np_port}/readyz",
            "coredns": f"http://127.0.0.1:{dns_ready}/ready",  # once it has listed Services
        }
        return node, args


def start(
    cluster: Any,
    launcher: Launcher,
    network: NodeNetwork,
    pki: _pki.Pki,
    registry: str,
    deadline: float,
) -> RealNode:
    """Starts containerd, kubelet, kube-proxy, kube-network-policies and CoreDNS for `network`, waits until
    the node is Ready and names resolve, and advertises its (fake) GPUs. Their PIDs go into cluster.pids like
    every other component's."""
    node, args = RealNode.configure(cluster.workdir, cluster.bin_dir, network, pki, cluster.server, registry)
    rbac = [*clusterdns.RBAC, *NETPOL_RBAC]
    cluster.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": rbac}))
    env = {
        # containerd finds its shim next to itself; kubelet sees no iptables (KUBELET_PATH).
        "containerd": {**os.environ, "PATH": f"{cluster.bin_dir}:{os.environ.get('PATH', '')}"},
        "kubelet": {**os.environ, "PATH": KUBELET_PATH},
    }
    for name in NODE_COMPONENTS:
        cluster.pids[name] = launcher.launch(name, args[name], env=env.get(name))
        cluster.save_state()
        if name == "containerd":
            launcher.wait(
                lambda: _socket_answers(node.paths.containerd_socket),
                "containerd's socket",
                deadline,
                log_of="containerd",
            )
    network.owner_pid = cluster.pids["containerd"]
    network.save()
    for name, url in node.healthz.items():
        launcher.wait_http(name, url, deadline)
    api = cluster.api_client()
    try:
        _objects.wait_nodes_ready(launcher, api, [node.name], deadline, log_of="kubelet")
    finally:
        api.close()
    # Capacity as the extended-resource documentation says; allocatable too, so that the scheduler sees
    # the GPUs now rather than after the kubelet's next status update.
    patch = [
        {"op": "add", "path": f"/status/{field}/nvidia.com~1gpu", "value": GPU_CAPACITY}
        for field in ("capacity", "allocatable")
    ]
    cluster.kubectl(
        "patch", "node", node.name, "--subresource=status", "--type=json", f"-p={json.dumps(patch)}"
    )
    return node


PREPULL_POD = "pagoda-prepull"


def prepull(cluster: Any, image: str) -> None:
    """Has the kubelet pull `image` in the background, as a pre-puller DaemonSet does on a real cluster: a
    Pod bound to the node (no scheduler, like a DaemonSet's) in kube-system whose container only exits 0.
    The first runtime pod of a session then finds the 7 GB CPU runtime image on the node instead of waiting
    about a minute for it. Through the CRI, so the image is recorded as any pod's pull is (its `imageID` is
    the registry's manifest digest); the kubelet pulls in parallel (`serializeImagePulls: false`), so other
    pods' pulls do not queue behind it. Best effort: a pod that needs the image first pulls it itself."""
    restricted = {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PREPULL_POD, "namespace": "kube-system"},
        "spec": {
            "nodeName": NODE_NAME,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "pull",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["true"],
                    "securityContext": restricted,
                }
            ],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))


def _socket_answers(path: Path) -> bool:
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def drain(cluster: Any, timeout: float = 30.0) -> None:
    """Deletes the node's pods while its kubelet still runs, so that each gets its preStop, SIGTERM and CNI
    teardown as in a cluster; best effort: `teardown` removes whatever is left."""
    cluster.kubectl(
        "delete",
        "pods",
        "--all-namespaces",
        f"--field-selector=spec.nodeName={NODE_NAME}",
        "--grace-period=5",
        "--wait=true",
        f"--timeout={int(timeout)}s",
        check=False,
        timeout=timeout + 10,
    )


def teardown(net: NodeNetwork, bin_dir: Path | None = None) -> None:
    """After the node's processes were stopped: every container process, shim, mount, cgroup, link, route,
    nftables table and conntrack entry the node made. Safe to run twice."""
    paths = NodePaths.under(Path(net.workdir))
    _kill_shims(paths)
    _unmount_under(paths.root)
    _remove_cgroups(net.cgroup_root)
    proxy = (bin_dir or Path(os.environ.get("PAGODA_BIN", ".pagoda-dev/bin"))) / "kube-proxy"
    config = paths.root / "kube-proxy.yaml"
    if proxy.is_file() and config.is_file():  # kube-proxy leaves its nftables tables after SIGTERM
        run(str(proxy), "--cleanup", f"--config={config}", check=False)
    else:
        for family in ("ip", "ip6"):
            run("nft", "delete", "table", family, "kube-proxy", check=False)
    # kube-network-policies deletes its tables on SIGTERM; a killed one leaves them, and their NFQUEUE rules
    # would then drop new connections to pods (no agent answers the queue).
    for family, table in NETPOL_TABLES:
        run("nft", "delete", "table", family, table, check=False)
    for result in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
        result.unlink(missing_ok=True)  # containerd's CNI library caches results here whatever its config
    # containerd's content store and unpacked layers: about 10 GB once the runtime image was pulled, and
    # nothing a later cluster reuses (the registry keeps the images); logs and configuration stay.
    shutil.rmtree(paths.root / "containerd" / "root", ignore_errors=True)
    shutil.rmtree(paths.containerd_state, ignore_errors=True)
    net.down()


def _kill_shims(paths: NodePaths) -> None:
    """SIGKILL every process whose command line names this node's containerd state: its shims and,
    through them, the containers (which runc started in their own pid namespaces under the shims)."""
    marker = str(paths.root)
    victims = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmdline and marker in cmdline:
            victims.append(int(proc.name))
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # A container's first process is in a pid namespace of its own: with it killed, the kernel kills the
    # rest; whatever is left in the node's cgroups, _remove_cgroups kills.


def _unmount_under(root: Path) -> None:
    """Unmounts everything below `root` (container rootfs overlays, pod volumes, network namespaces),
    deepest first."""
    prefix = str(root.resolve()) + "/"
    for _ in range(3):
        mounts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                mounts.append(point)
        if not mounts:
            return
        for point in sorted(set(mounts), key=len, reverse=True):
            run("umount", "-l", point, check=False)


def _remove_cgroups(cgroup_root: str) -> None:
    """Kills whatever still runs in the node's cgroups, then removes them, deepest first."""
    for hierarchy in _cgroup_controllers():
        top = hierarchy / cgroup_root.lstrip("/")
        if not top.is_dir():
            continue
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for group in [*groups, top]:
            for _ in range(50):
                try:
                    pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)


def pod_cgroups(net: NodeNetwork, uid: str) -> list[Path]:
    """The cgroups the kubelet made for the pod with `uid` (`pod<uid>` under kubepods, cgroupfs driver):
    none once the pod's containers ended and the kubelet cleaned up after it."""
    return [
        group
        for hierarchy in _cgroup_controllers()
        for group in (hierarchy / net.cgroup_root.lstrip("/")).rglob(f"pod{uid}")
    ]


def leftovers(net: NodeNetwork) -> list[str]:
    """What of `net`'s node is still on this machine (empty after a clean teardown): processes naming its
    folders, mounts below them, its cgroups, links, nftables tables (its own, kube-proxy's and
    kube-network-policies'), routes."""
    root = str(NodePaths.under(Path(net.workdir)).root)
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if root in cmdline:
                found.append(f"process {proc.name}: {cmdline[:120]}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if line.split()[4].startswith(root + "/"):
            found.append(f"mount {line.split()[4]}")
    found += [
        f"cgroup {h / net.cgroup_root.lstrip('/')}"
        for h in _cgroup_controllers()
        if (h / net.cgroup_root.lstrip("/")).exists()
    ]
    links = {str(link.get("ifname", "")) for link in podnet.links()}
    found += [f"link {name}" for name in (net.bridge, net.sink) if name in links]
    tables = run("nft", "list", "tables").stdout.split("\n")
    others = (" kube-proxy", *(f"{family} {table}" for family, table in NETPOL_TABLES))
    found += [f"nftables {t.strip()}" for t in tables if net.table in t or t.strip().endswith(others)]
    routes = run("ip", "route", "show", SERVICE_RANGE).stdout.strip()
    if routes:
        found.append(f"route {routes}")
    if net.record.exists():
        found.append(f"record {net.record}")
    return found
