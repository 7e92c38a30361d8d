"""The harness's pod address plan (test harness, not product code), shared by kwok and the real node.

Nothing addressed to the pod range may leave the machine: kwok's fake pods get addresses from the lower half
of the range (--cidr 10.244.0.0/17) that exist nowhere, so the host routes the whole range as `unreachable`
while a cluster's kwok runs (guard_pod_range);
only a real node's bridge subnet (a /24 in the upper half, e2e/lab/realnode.py) is more specific and reaches
real pods.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
from pathlib import Path

POD_RANGE = ipaddress.ip_network("10.244.0.0/16")
FAKE_POD_CIDR = "10.244.0.0/17"  # kwok's --cidr: addresses of fake pods, routed nowhere
SERVICE_CIDR = "10.96.0.0/16"  # the API server's --service-cluster-ip-range
REAL_SUBNETS = ipaddress.ip_network("10.244.128.0/17")  # a /24 of it per real node
BRIDGE_PREFIX = "pgk"  # e2e/lab/realnode.py's links
ROUTE_OWNERS = Path("/run/pagoda-podrange")  # <pid>: a kwok whose fake pods need the `unreachable` route


class NetworkError(RuntimeError):
    """An `ip` command failed."""


def ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetworkError(f"`ip {' '.join(args)}` failed: {proc.stderr.strip()}")
    return proc.stdout


def links() -> list[dict[str, object]]:
    return list(json.loads(ip("-j", "addr", "show") or "[]"))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _used_subnets() -> set[ipaddress.IPv4Network]:
    used = set()
    for link in links():
        for addr in link.get("addr_info", []):  # type: ignore[attr-defined]
            if addr.get("family") == "inet":
                used.add(ipaddress.ip_interface(f"{addr['local']}/{addr['prefixlen']}").network)
    return used


def free_subnet() -> ipaddress.IPv4Network:
    """A /24 of REAL_SUBNETS that no address on this host overlaps: a new bridge's subnet."""
    used = _used_subnets()
    return next(s for s in REAL_SUBNETS.subnets(new_prefix=24) if not any(s.overlaps(u) for u in used))


def guard_pod_range(owner_pid: int) -> None:
    """Routes the pod range `unreachable` on this host while `owner_pid` lives (a cluster's kwok, whose
    fake pods have addresses in it): a request to a fake pod then fails here, never taking the default
    route."""
    ROUTE_OWNERS.mkdir(parents=True, exist_ok=True)
    (ROUTE_OWNERS / str(owner_pid)).touch()
    ip("route", "replace", "unreachable", str(POD_RANGE))


def release_pod_range(owner_pid: int | None = None) -> None:
    """Forgets `owner_pid`, then drops the pod range's `unreachable` route once no owner lives and no real
    node's bridge is left (several clusters may run on one machine)."""
    if owner_pid is not None:
        (ROUTE_OWNERS / str(owner_pid)).unlink(missing_ok=True)
    owners = [p for p in ROUTE_OWNERS.glob("*") if p.name.isdigit()] if ROUTE_OWNERS.is_dir() else []
    live = [p for p in owners if alive(int(p.name))]
    for record in set(owners) - set(live):
        record.unlink(missing_ok=True)
    if live or any(str(link.get("ifname", "")).startswith(BRIDGE_PREFIX) for link in links()):
        return
    ip("route", "delete", "unreachable", str(POD_RANGE), check=False)
