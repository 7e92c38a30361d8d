"""Pod networking for the node agent (test harness, not product code): a host bridge per agent, one network
namespace per pod with a veth into the bridge, and an address from a private /24 of the pod range.

Nothing addressed to the pod range may leave the machine: kwok's fake pods get addresses from the lower half
of the range (--cidr 10.244.0.0/17) that exist nowhere, so the host routes the whole range as `unreachable`;
only an agent's bridge subnet (a /24 in the upper half) is more specific and reaches real pods. Pods get no
default route, only the pod range through the bridge, so a pod cannot send anywhere else either.

Names share the prefix `pagoda-` (namespaces) and `pg` (links), with the agent's id, so that `sweep()` can
remove what an agent that was killed left behind: its pod processes, namespaces and bridge.
"""

from __future__ import annotations

import ctypes
import ipaddress
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

POD_RANGE = ipaddress.ip_network("10.244.0.0/16")
FAKE_POD_CIDR = "10.244.0.0/17"  # kwok's --cidr: addresses of fake pods, routed nowhere
REAL_SUBNETS = ipaddress.ip_network("10.244.128.0/17")  # a /24 of it per node agent
NETNS_PREFIX = "pagoda-"
RUN_DIR = Path("/run/pagoda-nodeagent")  # <id>.pid: the agent that owns the names with that id
CLONE_NEWNET = 0x40000000


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc.stdout


def _links() -> list[dict[str, object]]:
    return list(json.loads(ip("-j", "addr", "show") or "[]"))


def _netns_names() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def bridge_name(agent_id: str) -> str:
    return f"pgbr{agent_id}"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_alive(agent_id: str) -> bool:
    try:
        return alive(int((RUN_DIR / f"{agent_id}.pid").read_text()))
    except (OSError, ValueError):
        return False


def kill_netns_processes(netns: str) -> None:
    """SIGKILL every process in the namespace (a pod's container and all it spawned), then wait for them."""
    deadline = time.monotonic() + 30
    while True:
        pids = [int(p) for p in ip("netns", "pids", netns, check=False).split()]
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            raise NetworkError(f"Processes {pids} in network namespace {netns} did not die.")
        time.sleep(0.1)


def delete_netns(netns: str) -> None:
    kill_netns_processes(netns)
    ip("netns", "delete", netns, check=False)  # takes the pod's veth, and so its host end, with it


def sweep(agent_id: str | None = None) -> list[str]:
    """Removes what agents left behind: `agent_id`'s names (an agent restarting with its old id) and those
    of every agent whose pid file names no live process. Returns what it removed."""
    removed = []
    for netns in _netns_names():
        if not netns.startswith(NETNS_PREFIX):
            continue
        owner = netns[len(NETNS_PREFIX) :].split("-", 1)[0]
        if owner == agent_id or not owner_alive(owner):
            delete_netns(netns)
            removed.append(f"netns {netns}")
    for link in _links():
        name = str(link.get("ifname", ""))
        if name.startswith("pgbr"):
            owner = name[len("pgbr") :]
            if owner == agent_id or not owner_alive(owner):
                ip("link", "delete", name, check=False)
                removed.append(f"link {name}")
    release_pod_range()
    return removed


def _used_subnets() -> set[ipaddress.IPv4Network]:
    used = set()
    for link in _links():
        for addr in link.get("addr_info", []):  # type: ignore[attr-defined]
            if addr.get("family") == "inet":
                used.add(ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}").network)
    return used


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of REAL_SUBNETS that no address on this host overlaps: a new bridge's subnet."""
    used = _used_subnets()
    return next(s for s in REAL_SUBNETS.subnets(new_prefix=24) if not any(s.overlaps(u) for u in used))


def release_pod_range() -> None:
    """Drops the pod range's `unreachable` route once no harness bridge is left: it stays while a node
    agent's (`pgbr`) or a real node's (`pgk`, e2e/realnode.py) bridge lives."""
    if not any(str(link.get("ifname", "")).startswith(("pgbr", "pgk")) for link in _links()):
        ip("route", "delete", "unreachable", str(POD_RANGE), check=False)


def setns_net(netns: str) -> None:
    """Moves the calling process into network namespace `netns` (Python 3.11 has no os.setns)."""
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns})")
    finally:
        os.close(fd)


@dataclass
class PodNetwork:
    """The bridge of one agent and the namespaces of its pods."""

    agent_id: str
    subnet: ipaddress.IPv4Network = field(init=False)
    _free: list[ipaddress.IPv4Address] = field(init=False, default_factory=list)
    _counter: int = 0

    def __post_init__(self) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        (RUN_DIR / f"{self.agent_id}.pid").write_text(str(os.getpid()))
        sweep(self.agent_id)
        self.subnet = free_subnet()
        bridge = bridge_name(self.agent_id)
        ip("link", "add", bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", bridge)
        ip("link", "set", bridge, "up")
        ip("route", "replace", "unreachable", str(POD_RANGE))
        self._free = list(self.subnet.hosts())[1:]

    @property
    def gateway(self) -> ipaddress.IPv4Address:
        return next(self.subnet.hosts())

    def netns_name(self, pod_uid: str) -> str:
        return f"{NETNS_PREFIX}{self.agent_id}-{pod_uid}"

    def add_pod(self, pod_uid: str) -> tuple[str, str]:
        """A namespace with loopback and eth0 on the bridge; returns (namespace name, pod IP)."""
        netns = self.netns_name(pod_uid)
        address = self._free.pop(0)
        self._counter += 1
        host_end = f"pg{self.agent_id}v{self._counter}"
        try:
            ip("netns", "add", netns)
            ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
            ip("link", "set", host_end, "master", bridge_name(self.agent_id), "up")
            ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            ip("-n", netns, "link", "set", "lo", "up")
            ip("-n", netns, "link", "set", "eth0", "up")
            ip("-n", netns, "route", "add", str(POD_RANGE), "via", str(self.gateway))
        except NetworkError:
            self.remove_pod(pod_uid, str(address))
            raise
        return netns, str(address)

    def remove_pod(self, pod_uid: str, address: str | None) -> None:
        delete_netns(self.netns_name(pod_uid))
        if address is not None:
            self._free.append(ipaddress.ip_address(address))  # type: ignore[arg-type]

    def close(self) -> None:
        sweep(self.agent_id)
        (RUN_DIR / f"{self.agent_id}.pid").unlink(missing_ok=True)
