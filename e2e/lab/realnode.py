"""A real Kubernetes node on this machine: containerd (from its Go module) with Debian's runc, the CNI
bridge, host-local and loopback plugins, and kubelet and kube-proxy from the pinned Kubernetes, all built by
e2e/lab/tools/build.sh. Its pods run from OCI images pulled from the local registry (e2e/lab/registry.py),
with their securityContext and resource limits enforced by runc and the kernel; Services work through
kube-proxy (nftables mode), their names resolve through CoreDNS (e2e/lab/clusterdns.py), and NetworkPolicies
are enforced by kube-network-policies (SIG Network's agent, e2e/lab/tools/netpol: the first packet of each
connection to a pod goes to it through NFQUEUE). Only the GPU is simulated: the node
advertises `nvidia.com/gpu` as a node-level extended resource (the one fake), so that Pagoda's GPU pods
schedule here unchanged.

    network = NodeNetwork.create(workdir)  # before kube-apiserver, which serves on network.address
    node = start(cluster, launcher, network, pki, registry, deadline)
    teardown(network)                      # pods, processes, mounts, cgroups, links, nftables: all gone

A second node, `pagoda-kubelet-1`, can join a running cluster (`start_extra`, through
e2e/lab/cluster.py `Cluster.add_node`): its own containerd, kubelet, cgroup root, bridge and /24, on the same
machine. It runs no host services of its own: node 0's kube-proxy, CoreDNS and kube-network-policies serve
both, because every packet between pods of the two nodes is routed through this one host, whose netfilter
hooks are the same for both bridges (kube-proxy's DNAT, the agent's NFQUEUE rule, the guard table).

No packet leaves the machine:
- pods get an address on the node's bridge and routes for the pod and Service ranges only, never a default
  route; the host routes the pod range `unreachable` (only the bridge's /24 is more specific) and the
  Service range to a local sink device (`ifb`: this kernel has no `dummy`), so a ClusterIP without a
  kube-proxy rule ends on this host;
- an nftables table of the harness's own drops anything from the pod or Service ranges, or forwarded from a
  harness bridge, that would leave by an interface other than loopback or the harness's own links;
- containerd sends every registry (its catch-all `_default` host) to the local registry, so a missing image
  fails at once with ErrImagePull instead of a lookup elsewhere.

One real cluster per machine at a time: kube-proxy's and kube-network-policies' nftables tables (and the
latter's NFQUEUE number) are fixed, so a second cluster's would rewrite the first one's. `NodeNetwork.create`
refuses with the owner's workdir; a cluster's own second node shares them (above).

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

NODE_NAME = "pagoda-kubelet-0"  # node 0, which also runs the host services (HOST_SERVICES)
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
# What node 0 runs for the whole machine, and so for every node of its cluster (a second node runs only the
# rest of NODE_COMPONENTS: its containerd and kubelet).
HOST_SERVICES = ("kube-proxy", "kube-network-policies", "coredns")
EXTRA_COMPONENTS = tuple(name for name in NODE_COMPONENTS if name not in HOST_SERVICES)
# kube-network-policies' nftables tables: its controller's (inet; it cannot install it on a kernel without
# nftables' queue expression), and the one our main (e2e/lab/tools/netpol) queues with the xtables target
# instead (ip); and its client certificate's name.
NETPOL_TABLES = (("inet", "kube-network-policies"), ("ip", "pagoda-netpol-queue"))
NETPOL_USER = "system:kube-network-policies"
# What the agent queues: every real node's subnet, not only node 0's. One agent serves the cluster's nodes:
# a second one cannot run beside it (the tables above and NFQUEUE 100 are fixed), and needs not: every packet
# between pods crosses this host's postrouting hook (routed between bridges, or bridged with bridge
# netfilter on), and the controller decides it by the pods it finds at the packet's two addresses in its
# informer of all the cluster's pods (v0.8.0 `evaluatePacket`), whichever node runs them. Its node name
# matters only for its own nftables table, which this kernel cannot load anyway.
NETPOL_QUEUE_CIDR = str(podnet.REAL_SUBNETS)
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
    sink, the routes and the guard table. Made before kube-apiserver, which serves on `address`.

    Node 0 (`index` 0) is the cluster's first; a second node's network (`create_extra`) has a bridge, a
    subnet and a guard table of its own but no sink: node 0's carries the Service range for the host."""

    node_id: str
    subnet: str
    workdir: str
    owner_pid: int  # the harness process that made it (or containerd's, once `make cluster-up` detaches)
    index: int = 0  # which node of its cluster: its name is pagoda-kubelet-<index>

    @property
    def name(self) -> str:
        return f"pagoda-kubelet-{self.index}"

    @property
    def primary(self) -> bool:
        """Whether this is node 0, which owns what the host has once: the Service range's sink and route,
        kube-proxy's and kube-network-policies' tables (HOST_SERVICES)."""
        return self.index == 0

    @property
    def cni_network(self) -> str:
        """The CNI network's name, which names its cached results in /var/lib/cni/results (`<name>-<container
        id>-<ifname>`, whatever containerd's config says): one per node, so that a node's teardown removes
        its own only. Node 0 keeps the name it always had."""
        return CNI_NETWORK if self.primary else f"{CNI_NETWORK}-node{self.index}"

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
    def lost_table(self) -> str:
        """The table that cuts the node off when it loses its power (`power_off`)."""
        return f"{self.table}-lost"

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
        return cls(uuid.uuid4().hex[:6], str(podnet.free_subnet()), str(workdir), os.getpid())._made()

    @classmethod
    def create_extra(cls, first: NodeNetwork, index: int) -> NodeNetwork:
        """The network of node `index` (1, ...) of the cluster whose node 0 has `first`: the next free /24 of
        REAL_SUBNETS and a bridge of its own, routed to node 0's through the host."""
        if not first.primary or not first.record.exists():
            raise NodeError(f"Node {index} joins a running node 0; {first.record} is not one.")
        net = cls(uuid.uuid4().hex[:6], str(podnet.free_subnet()), first.workdir, os.getpid(), index)
        return net._made()

    def _made(self) -> NodeNetwork:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        self.save()
        try:
            self._up()
        except BaseException:
            self.down()
            raise
        return self

    def save(self) -> None:
        self.record.write_text(json.dumps(asdict(self)) + "\n")

    def _up(self) -> None:
        prefix = ipaddress.ip_network(self.subnet).prefixlen
        run("ip", "link", "add", self.bridge, "type", "bridge")
        run("ip", "addr", "add", f"{self.address}/{prefix}", "dev", self.bridge)
        # Bridged replies between two pods of one bridge pass netfilter, so that a Service's DNAT is undone
        # (pod -> ClusterIP -> pod on the same node); and packets that arrive on the bridge may be routed
        # back out of it (that same hairpin) or to another node's bridge (per input interface: the host's
        # ip_forward stays 0). Nothing else is forwarded: the guard table drops it.
        run("ip", "link", "set", self.bridge, "type", "bridge", "nf_call_iptables", "1")
        Path(f"/proc/sys/net/ipv4/conf/{self.bridge}/forwarding").write_text("1\n")
        run("ip", "link", "set", self.bridge, "up")
        if self.primary:
            run("ip", "link", "add", self.sink, "type", "ifb")
            run("ip", "link", "set", self.sink, "up")
        run("ip", "route", "replace", "unreachable", POD_RANGE)
        if self.primary:
            run("ip", "route", "replace", SERVICE_RANGE, "dev", self.sink, "src", self.address)
        # Every node has the same table under its own name: its rules name all the harness's links and
        # ranges, so whichever node's network is left (a sweep removes them one by one) still guards.
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
        """Removes the links, routes and table (the pods' veths went with their namespaces), and the
        conntrack entries: node 0's of both ranges, a second node's of its own subnet only (node 0's
        connections, DNAT included, live on)."""
        for table in (self.table, self.lost_table):
            run("nft", "delete", "table", "inet", table, check=False)
        if self.primary:
            run("ip", "route", "delete", SERVICE_RANGE, "dev", self.sink, check=False)
        for link in (self.sink, self.bridge) if self.primary else (self.bridge,):
            run("ip", "link", "delete", link, check=False)
        podnet.release_pod_range()
        for proto_range in ("-s", "-d"):
            for cidr in (POD_RANGE, SERVICE_RANGE) if self.primary else (self.subnet,):
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


def teardown_order(nets: list[NodeNetwork]) -> list[NodeNetwork]:
    """Second nodes before node 0: node 0's network holds what they share (the Service range's sink and
    route, the host services' tables), so it goes last, as `Cluster.stop` does it."""
    return sorted(nets, key=lambda net: (-net.index, net.node_id))


def sweep() -> list[str]:
    """Tears down every node whose owner is gone (a harness that was killed); returns their workdirs."""
    removed = []
    for net in teardown_order(_records()):
        if not podnet.alive(net.owner_pid):
            teardown(net)
            removed.append(net.workdir)
    return removed


@dataclass
class NodePaths:
    """Where one node keeps its configuration and state (all under WORKDIR/node for node 0, WORKDIR/node-<i>
    for node i)."""

    root: Path

    @classmethod
    def under(cls, workdir: Path, index: int = 0) -> NodePaths:
        return cls(workdir / ("node" if index == 0 else f"node-{index}"))

    @classmethod
    def of(cls, net: NodeNetwork) -> NodePaths:
        return cls.under(Path(net.workdir), net.index)

    @property
    def marker(self) -> str:
        """What a command line naming this node's files contains (its root with the slash: node 0's root,
        WORKDIR/node, is a prefix of node 1's, WORKDIR/node-1)."""
        return f"{self.root}/"

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
        "name": net.cni_network,
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
    net: NodeNetwork, paths: NodePaths, pki: _pki.Pki, port: int, healthz: int, dns: str
) -> dict[str, Any]:
    """`dns`: CoreDNS's address, node 0's (one CoreDNS serves the cluster)."""
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
        # Pods get the cluster's DNS (CoreDNS on node 0's address), never the host's resolver.
        "clusterDNS": [dns],
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
        cls,
        workdir: Path,
        bin_dir: Path,
        network: NodeNetwork,
        pki: _pki.Pki,
        server: str,
        registry: str,
        dns: str | None = None,
    ) -> tuple[RealNode, dict[str, list[str]]]:
        """Writes every configuration file (under the node's folder, nothing else); returns the node and each
        component's arguments, in start order (NODE_COMPONENTS for node 0, EXTRA_COMPONENTS for another).
        `dns`: CoreDNS's address, node 0's (default: this node's own, for node 0)."""
        paths = NodePaths.under(workdir, network.index)
        for sub in ("containerd/certs.d/_default", "cni", "cni-ipam", "kubelet", "pod-logs"):
            (paths.root / sub).mkdir(parents=True, exist_ok=True)
        (paths.root / "containerd.toml").write_text(_containerd_config(paths, bin_dir))
        (paths.root / "containerd/certs.d/_default/hosts.toml").write_text(_registry_hosts(registry))
        (paths.root / "cni" / f"10-{network.cni_network}.conflist").write_text(
            json.dumps(_cni_config(network, paths), indent=2) + "\n"
        )
        root, name = paths.root, network.name
        _pki.issue_leaf(
            pki,
            root / "kubelet-client.crt",
            root / "kubelet-client.key",
            f"system:node:{name}",
            "system:nodes",
        )
        _pki.issue_leaf(
            pki,
            root / "kubelet.crt",
            root / "kubelet.key",
            f"system:node:{name}",
            "system:nodes",
            server_ips=(network.address,),
        )
        _pki.write_kubeconfig(
            root / "kubelet.kubeconfig",
            server,
            pki,
            user=f"system:node:{name}",
            cert=root / "kubelet-client.crt",
            key=root / "kubelet-client.key",
        )
        kubelet_port, kubelet_healthz = free_ports(2)
        (root / "kubelet.yaml").write_text(
            yaml.safe_dump(
                _kubelet_config(network, paths, pki, kubelet_port, kubelet_healthz, dns or network.address)
            )
        )
        args = {
            "containerd": [f"--config={root / 'containerd.toml'}", "--log-level=warn"],
            "kubelet": [
                f"--config={root / 'kubelet.yaml'}",
                f"--kubeconfig={root / 'kubelet.kubeconfig'}",
                f"--root-dir={paths.kubelet_dir}",
                f"--cert-dir={root / 'kubelet-pki'}",
                f"--hostname-override={name}",
                f"--node-ip={network.address}",
                f"--node-labels={NODE_LABEL}=true",
                "--v=1",
            ],
        }
        node = cls(network, paths, bin_dir, name)
        node.healthz = {"kubelet": f"http://127.0.0.1:{kubelet_healthz}/healthz"}
        if network.primary:
            node._configure_host_services(pki, server, args)
        return node, args

    def _configure_host_services(self, pki: _pki.Pki, server: str, args: dict[str, list[str]]) -> None:
        """Node 0's kube-proxy, CoreDNS and kube-network-policies (HOST_SERVICES), which serve every node of
        the cluster: their certificates, configuration and arguments."""
        network, paths, root = self.network, self.paths, self.paths.root
        _pki.issue_leaf(pki, root / "kube-proxy.crt", root / "kube-proxy.key", "system:kube-proxy")
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
        proxy_healthz, proxy_metrics, dns_health, dns_ready, np_port = free_ports(5)
        (root / "Corefile").write_text(
            clusterdns.corefile(network.address, root / "coredns.kubeconfig", dns_health, dns_ready)
        )
        paths.resolv_conf.write_text(clusterdns.resolv_conf(network.address))
        (root / "kube-proxy.yaml").write_text(
            yaml.safe_dump(_kube_proxy_config(network, paths, proxy_healthz, proxy_metrics))
        )
        args["kube-proxy"] = [f"--config={root / 'kube-proxy.yaml'}", "--v=1"]
        args["kube-network-policies"] = [
            f"--kubeconfig={root / 'kube-network-policies.kubeconfig'}",
            f"--hostname-override={NODE_NAME}",
            f"--metrics-bind-address=127.0.0.1:{np_port}",
            # NRI stays on, as upstream runs it: with it off, v0.8.0 looks an address that is no
            # known pod's up in a nil plugin. containerd's NRI is off here (_containerd_config), so
            # the plugin's dial fails once and the pod IPs come from the API server.
            "--fail-open=false",  # new connections to pods drop while no agent answers the queue
            # This kernel lacks nftables' queue expression (CONFIG_NFT_QUEUE), which the controller's own
            # table needs: our main queues with the xtables NFQUEUE target instead (e2e/lab/tools/netpol).
            f"--xt-queue-cidr={NETPOL_QUEUE_CIDR}",
            "--v=1",
        ]
        args["coredns"] = [f"-conf={root / 'Corefile'}"]
        self.healthz.update(
            {
                "kube-proxy": f"http://127.0.0.1:{proxy_healthz}/healthz",
                # Our main's (e2e/lab/tools/netpol): once its informers synced; it programs its table right
                # after.
                "kube-network-policies": f"http://127.0.0.1:{np_port}/readyz",
                "coredns": f"http://127.0.0.1:{dns_ready}/ready",  # once it has listed Services
            }
        )


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
    _launch(cluster, launcher, node, args, cluster.pids, deadline)
    return node


def start_extra(
    cluster: Any,
    launcher: Launcher,
    network: NodeNetwork,
    pki: _pki.Pki,
    registry: str,
    pids: dict[str, int],
    deadline: float,
) -> RealNode:
    """Starts a second node's containerd and kubelet (EXTRA_COMPONENTS) for `network` beside node 0
    (`cluster.node`), whose kube-proxy, CoreDNS and kube-network-policies serve it too; waits until it is
    Ready and advertises its (fake) GPUs as node 0 does. Their PIDs go into `pids`, which the caller saves
    with the cluster's state."""
    assert cluster.node is not None, "a second node joins a cluster with node 0"
    node, args = RealNode.configure(
        cluster.workdir, cluster.bin_dir, network, pki, cluster.server, registry, dns=cluster.node.address
    )
    _launch(cluster, launcher, node, args, pids, deadline)
    return node


def _launch(
    cluster: Any,
    launcher: Launcher,
    node: RealNode,
    args: dict[str, list[str]],
    pids: dict[str, int],
    deadline: float,
) -> None:
    """Starts the node's components in `args`' order, recording each PID in `pids` (and the cluster's
    state) at once; then waits for their health, the node's Ready, and patches its GPUs in."""
    env = {
        # containerd finds its shim next to itself; kubelet sees no iptables (KUBELET_PATH).
        "containerd": {**os.environ, "PATH": f"{cluster.bin_dir}:{os.environ.get('PATH', '')}"},
        "kubelet": {**os.environ, "PATH": KUBELET_PATH},
    }
    for hierarchy in _cgroup_controllers():  # kubelet wants its cgroup root to exist
        (hierarchy / node.network.cgroup_root.lstrip("/")).mkdir(exist_ok=True)
    for name, argv in args.items():
        pids[name] = launcher.launch(name, argv, env=env.get(name))
        cluster.save_state()
        if name == "containerd":
            launcher.wait(
                lambda: _socket_answers(node.paths.containerd_socket),
                "containerd's socket",
                deadline,
                log_of="containerd",
            )
    node.network.owner_pid = pids["containerd"]
    node.network.save()
    cluster.save_state()
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


PREPULL_POD = "pagoda-prepull"  # node 0's; another node's is pagoda-prepull-<index>


def prepull(cluster: Any, image: str, node: str = NODE_NAME) -> None:
    """Has the kubelet pull `image` in the background, as a pre-puller DaemonSet does on a real cluster: a
    Pod bound to the node (no scheduler, like a DaemonSet's) in kube-system whose container only exits 0.
    The first runtime pod of a session then finds the 7 GB CPU runtime image on the node instead of waiting
    about a minute for it. Through the CRI, so the image is recorded as any pod's pull is (its `imageID` is
    the registry's manifest digest); the kubelet pulls in parallel (`serializeImagePulls: false`), so other
    pods' pulls do not queue behind it. Best effort: a pod that needs the image first pulls it itself.
    `node`: the node to pull onto (each node's containerd has a content store of its own)."""
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
        "metadata": {"name": prepull_pod(node), "namespace": "kube-system"},
        "spec": {
            "nodeName": node,
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


def prepull_pod(node: str) -> str:
    """The name of `prepull`'s Pod for `node`."""
    index = node.rsplit("-", 1)[1]
    return PREPULL_POD if node == NODE_NAME else f"{PREPULL_POD}-{index}"


def _socket_answers(path: Path) -> bool:
    with contextlib.closing(socket.socket(socket.AF_UNIX)) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def drain(cluster: Any, timeout: float = 30.0, node: str = NODE_NAME) -> None:
    """Deletes the node's pods while its kubelet still runs, so that each gets its preStop, SIGTERM and CNI
    teardown as in a cluster; best effort: `teardown` removes whatever is left. (Not `kubectl drain`: a
    harness stopping its node does not wait on PodDisruptionBudgets; Cluster.remove_node cordons first, so
    that replacements go to the nodes that stay.)"""
    cluster.kubectl(
        "delete",
        "pods",
        "--all-namespaces",
        f"--field-selector=spec.nodeName={node}",
        "--grace-period=5",
        "--wait=true",
        f"--timeout={int(timeout)}s",
        check=False,
        timeout=timeout + 10,
    )


def teardown(net: NodeNetwork, bin_dir: Path | None = None) -> None:
    """After the node's processes were stopped: every container process, shim, mount, cgroup, link, route,
    nftables table and conntrack entry the node made. Safe to run twice. A second node's leaves node 0's
    host services (kube-proxy's and kube-network-policies' tables) alone."""
    paths = NodePaths.of(net)
    _kill_shims(paths)
    _unmount_under(paths.root)
    _remove_cgroups(net.cgroup_root)
    results = Path("/var/lib/cni/results")
    for result in cni_results(net, sorted(p.name for p in results.iterdir()) if results.is_dir() else []):
        (results / result).unlink(missing_ok=True)  # containerd's CNI library caches results here whatever
    # containerd's content store and unpacked layers: about 10 GB once the runtime image was pulled, and
    # nothing a later cluster reuses (the registry keeps the images); logs and configuration stay.
    shutil.rmtree(paths.root / "containerd" / "root", ignore_errors=True)
    shutil.rmtree(paths.containerd_state, ignore_errors=True)
    if net.primary:
        _remove_host_services(paths, bin_dir)
    net.down()


def _remove_host_services(paths: NodePaths, bin_dir: Path | None) -> None:
    """The nftables tables node 0's host services leave (HOST_SERVICES)."""
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


def cni_results(net: NodeNetwork, names: list[str]) -> list[str]:
    """Of the file names in /var/lib/cni/results, those of `net`'s CNI network: `<network>-<container
    id>-<ifname>`, where a container id is 64 hex digits (so node 0's `pagoda-` never takes node 1's
    `pagoda-node1-`)."""
    prefix = f"{net.cni_network}-"
    found = []
    for name in names:
        container = name.removeprefix(prefix).split("-", 1)[0] if name.startswith(prefix) else ""
        if len(container) == 64 and all(c in "0123456789abcdef" for c in container):
            found.append(name)
    return found


def _kill_shims(paths: NodePaths) -> None:
    """SIGKILL every process whose command line names this node's containerd state: its shims and,
    through them, the containers (which runc started in their own pid namespaces under the shims)."""
    marker = paths.marker
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


def power_off(net: NodeNetwork, pids: dict[str, int]) -> None:
    """The node loses its power: first the machine drops every packet to or from its pods' subnet without a
    word (the `lost_table`), as a dead machine's peers see it: no reset, no ICMP, so a connection to it
    times out (a link set down would have this host answer `No route to host` at once instead, which a
    remote machine's death does not); then every process of it dies at once by SIGKILL: `pids` (its
    containerd and kubelet), the shims, every container. Nothing is cleaned up, as nothing would be: the
    Node object and its pods stay in the API server, as the node left them, until the control plane
    notices. `teardown` removes what is left on the machine."""
    rules = f"ip daddr {net.subnet} drop\n    ip saddr {net.subnet} drop"
    chains = "".join(
        f"  chain {hook} {{\n    type filter hook {hook} priority -10; policy accept;\n    {rules}\n  }}\n"
        for hook in ("output", "input", "forward")
    )
    run("nft", "-f", "-", input=f"table inet {net.lost_table} {{\n{chains}}}\n")
    for pid in pids.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    _kill_shims(NodePaths.of(net))
    for hierarchy in _cgroup_controllers():
        top = hierarchy / net.cgroup_root.lstrip("/")
        for group in [top, *(p for p in top.rglob("*") if p.is_dir())] if top.is_dir() else []:
            _kill_members(group)


def _kill_members(group: Path) -> list[int]:
    """SIGKILLs every process in the cgroup `group` (not below it); returns their PIDs."""
    try:
        pids = [int(p) for p in (group / "cgroup.procs").read_text().split()]
    except OSError:
        pids = []
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


def _remove_cgroups(cgroup_root: str) -> None:
    """Kills whatever still runs in the node's cgroups, then removes them, deepest first."""
    for hierarchy in _cgroup_controllers():
        top = hierarchy / cgroup_root.lstrip("/")
        if not top.is_dir():
            continue
        groups = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for group in [*groups, top]:
            for _ in range(50):
                _kill_members(group)
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
    folders, mounts below them, its cgroups, links, nftables tables (its own; node 0's also kube-proxy's and
    kube-network-policies'), routes, cached CNI results. A second node's leaves out what node 0 still runs
    for both, so that it can be checked while node 0 runs on."""
    marker = NodePaths.of(net).marker
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                found.append(f"process {proc.name}: {cmdline[:120]}")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        if line.split()[4].startswith(marker):
            found.append(f"mount {line.split()[4]}")
    found += [
        f"cgroup {h / net.cgroup_root.lstrip('/')}"
        for h in _cgroup_controllers()
        if (h / net.cgroup_root.lstrip("/")).exists()
    ]
    links = {str(link.get("ifname", "")) for link in podnet.links()}
    found += [f"link {name}" for name in (net.bridge, net.sink) if name in links]
    tables = run("nft", "list", "tables").stdout.split("\n")
    others = (" kube-proxy", *(f"{family} {table}" for family, table in NETPOL_TABLES)) if net.primary else ()
    found += [
        f"nftables {t.strip()}"
        for t in tables
        if t.strip() and (t.strip().split()[-1] in (net.table, net.lost_table) or t.strip().endswith(others))
    ]
    for cidr in (SERVICE_RANGE, net.subnet) if net.primary else (net.subnet,):
        routes = run("ip", "route", "show", cidr).stdout.strip()
        if routes:
            found.append(f"route {routes}")
    results = Path("/var/lib/cni/results")
    names = sorted(p.name for p in results.iterdir()) if results.is_dir() else []
    found += [f"CNI result {results / name}" for name in cni_results(net, names)]
    if net.record.exists():
        found.append(f"record {net.record}")
    return found
