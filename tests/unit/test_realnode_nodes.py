"""Two real nodes on one machine (e2e/lab/realnode.py): what each node's configuration names must be its own
(containerd's root, state and socket, the kubelet's folders, ports and cgroup root, the CNI network, bridge
and address range), node 1 must use node 0's cluster DNS, the NetworkPolicy agent must queue both nodes'
subnets, and a teardown must touch only its own node's leftovers. Pure functions and files written to a
temp dir: no cluster, no root."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lab import _pki, podnet, realnode
from e2e.lab.realnode import NodeNetwork, NodePaths


def _net(tmp_path: Path, index: int, subnet: str, node_id: str) -> NodeNetwork:
    return NodeNetwork(node_id, subnet, str(tmp_path), 1, index)


@pytest.fixture
def nets(tmp_path: Path) -> tuple[NodeNetwork, NodeNetwork]:
    return _net(tmp_path, 0, "10.244.128.0/24", "aaaaaa"), _net(tmp_path, 1, "10.244.129.0/24", "bbbbbb")


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> _pki.Pki:
    return _pki.write_pki(tmp_path_factory.mktemp("pki"))


def _configure(tmp_path: Path, net: NodeNetwork, pki: _pki.Pki, dns: str | None = None) -> Any:
    return realnode.RealNode.configure(
        tmp_path, tmp_path / "bin", net, pki, "https://10.244.128.1:6443", "127.0.0.1:5600", dns
    )


def test_node_names_and_links_are_per_node(nets: tuple[NodeNetwork, NodeNetwork]) -> None:
    node0, node1 = nets
    assert (node0.name, node1.name) == (realnode.NODE_NAME, "pagoda-kubelet-1")
    assert node0.primary and not node1.primary
    assert len({node0.bridge, node1.bridge, node0.sink}) == 3
    assert all(link.startswith(podnet.BRIDGE_PREFIX) for link in (node0.bridge, node1.bridge))
    assert node0.table != node1.table and node0.cgroup_root != node1.cgroup_root
    assert (node0.address, node1.address) == ("10.244.128.1", "10.244.129.1")
    assert node0.cni_network == realnode.CNI_NETWORK != node1.cni_network


def test_folders_do_not_nest_by_prefix(nets: tuple[NodeNetwork, NodeNetwork]) -> None:
    """Teardown and leftovers find a node's processes and mounts by its folder in their command lines: node
    0's marker must not match node 1's paths (WORKDIR/node is a string prefix of WORKDIR/node-1)."""
    node0, node1 = (NodePaths.of(net) for net in nets)
    assert node0.root != node1.root
    assert node0.marker not in f"--config={node1.root}/containerd.toml"
    assert node1.marker not in f"--config={node0.root}/containerd.toml"
    assert node0.marker in f"-address {node0.containerd_socket}"


def test_each_node_has_its_own_runtime_and_kubelet(
    tmp_path: Path, nets: tuple[NodeNetwork, NodeNetwork], pki: _pki.Pki
) -> None:
    node0, args0 = _configure(tmp_path, nets[0], pki)
    node1, args1 = _configure(tmp_path, nets[1], pki, dns=nets[0].address)
    assert list(args0) == list(realnode.NODE_COMPONENTS)
    assert list(args1) == list(realnode.EXTRA_COMPONENTS)  # node 0's host services serve node 1
    assert set(node1.healthz) == {"kubelet"}
    configs = [(n.paths.root / "containerd.toml").read_text() for n in (node0, node1)]
    for a, b in ((node0, node1), (node1, node0)):
        own = (a.paths.containerd_socket, a.paths.containerd_state, a.paths.root / "containerd" / "root")
        text = (a.paths.root / "containerd.toml").read_text()
        assert all(str(path) in text for path in own)
        assert str(b.paths.root) + "/" not in text
    assert configs[0] != configs[1]
    kubelets = [yaml.safe_load((n.paths.root / "kubelet.yaml").read_text()) for n in (node0, node1)]
    assert kubelets[0]["port"] != kubelets[1]["port"]
    assert kubelets[0]["healthzPort"] != kubelets[1]["healthzPort"]
    assert [k["cgroupRoot"] for k in kubelets] == [nets[0].cgroup_root, nets[1].cgroup_root]
    assert [k["address"] for k in kubelets] == [nets[0].address, nets[1].address]
    # One CoreDNS, on node 0's address, for the pods of both.
    assert kubelets[0]["clusterDNS"] == kubelets[1]["clusterDNS"] == [nets[0].address]
    assert f"--hostname-override={nets[1].name}" in args1["kubelet"]
    assert f"--node-ip={nets[1].address}" in args1["kubelet"]
    assert f"--root-dir={node1.paths.kubelet_dir}" in args1["kubelet"]
    cni = (node1.paths.root / "cni" / f"10-{nets[1].cni_network}.conflist").read_text()
    assert nets[1].bridge in cni and nets[1].subnet in cni and nets[0].bridge not in cni


def test_the_one_agent_queues_every_real_node(
    tmp_path: Path, nets: tuple[NodeNetwork, NodeNetwork], pki: _pki.Pki
) -> None:
    _, args = _configure(tmp_path, nets[0], pki)
    (queued,) = [
        a.split("=", 1)[1] for a in args["kube-network-policies"] if a.startswith("--xt-queue-cidr=")
    ]
    for subnet in podnet.REAL_SUBNETS.subnets(new_prefix=24):  # any /24 free_subnet() may give a node
        assert subnet.subnet_of(ipaddress.ip_network(queued))
    assert not ipaddress.ip_network(podnet.FAKE_POD_CIDR).overlaps(ipaddress.ip_network(queued))


def test_cni_results_of_a_node_are_its_own(nets: tuple[NodeNetwork, NodeNetwork]) -> None:
    container = "0123456789abcdef" * 4
    names = [
        f"pagoda-{container}-eth0",
        f"pagoda-node1-{container}-eth0",
        f"other-{container}-eth0",
        "pagoda-node1-not-a-container-eth0",
    ]
    assert realnode.cni_results(nets[0], names) == [f"pagoda-{container}-eth0"]
    assert realnode.cni_results(nets[1], names) == [f"pagoda-node1-{container}-eth0"]


def test_second_nodes_go_before_node_0(tmp_path: Path) -> None:
    records = [_net(tmp_path, 0, "10.244.128.0/24", "a"), _net(tmp_path, 1, "10.244.129.0/24", "b")]
    assert [n.index for n in realnode.teardown_order(records)] == [1, 0]
    assert [n.index for n in realnode.teardown_order(records[::-1])] == [1, 0]


def test_prepull_pods_are_named_per_node() -> None:
    assert realnode.prepull_pod(realnode.NODE_NAME) == realnode.PREPULL_POD
    assert realnode.prepull_pod("pagoda-kubelet-1") == f"{realnode.PREPULL_POD}-1"


def test_records_without_an_index_are_node_0(tmp_path: Path) -> None:
    """A record written before second nodes existed (no `index`) still loads, as node 0."""
    net = NodeNetwork(
        **{"node_id": "abc", "subnet": "10.244.128.0/24", "workdir": str(tmp_path), "owner_pid": 1}
    )
    assert net.primary and net.name == realnode.NODE_NAME and NodePaths.of(net).root == tmp_path / "node"
