"""Cluster DNS for the real node: CoreDNS v1.15.0 (built from its Go module, e2e/lab/tools/coredns) with its
`kubernetes` plugin, as a host process of the node like kube-proxy, serving `cluster.local` on the node's
bridge address. The kubelet gives every pod (dnsPolicy ClusterFirst) that address as its nameserver with the
usual search path, so `<service>.<namespace>.svc` resolves in pods as in any cluster.

Nothing is forwarded: CoreDNS serves only `cluster.local` and the reverse zone, and refuses every other name
at once (REFUSED), so a pod looking a public name up fails fast and no packet leaves the machine.

The harness's own add-ons that stand in for in-cluster components (KEDA's operator, which queries the
Prometheus a ScaledObject names) run as host processes; `in_cluster_dns(argv, resolv_conf)` starts such a
process in a mount namespace of its own where /etc/resolv.conf is the one a pod gets, so that a
ScaledObject's default `http://prometheus-operated.monitoring.svc:9090` resolves for it as it does in a
user's cluster. The host itself keeps its resolver.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CLUSTER_DOMAIN = "cluster.local"
REVERSE_ZONE = "in-addr.arpa"
USER = (
    "system:coredns"  # its client certificate's name, bound to the ClusterRole below (as kubeadm names both)
)

# What the kubernetes plugin lists and watches (CoreDNS's own deployment manifest grants the same).
RBAC: list[dict[str, Any]] = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": USER},
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["endpoints", "services", "pods", "namespaces"],
                "verbs": ["list", "watch"],
            },
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": USER},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": USER},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
    },
]


def corefile(address: str, kubeconfig: Path, health_port: int, ready_port: int) -> str:
    """CoreDNS's configuration: one server block for the cluster's zones on `address`:53; `ready` answers
    200 once the kubernetes plugin has listed Services and EndpointSlices."""
    return f"""{CLUSTER_DOMAIN}:53 {REVERSE_ZONE}:53 {{
    bind {address}
    errors
    health 127.0.0.1:{health_port}
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} {REVERSE_ZONE} {{
        kubeconfig {kubeconfig}
        pods insecure
        ttl 5
    }}
    cache 5
}}
"""


def resolv_conf(address: str) -> str:
    """The resolv.conf the kubelet writes into a pod, less the pod's own namespace in the search path (a host
    process has none): the cluster's nameserver, `svc.cluster.local cluster.local`, ndots 5."""
    return f"nameserver {address}\nsearch svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\noptions ndots:5\n"


def in_cluster_dns(argv: list[str], resolv: Path) -> list[str]:
    """`argv` run in a private mount namespace where `resolv` is bind-mounted on /etc/resolv.conf. unshare and
    sh exec in turn, so the process keeps the PID the caller records (and its executable is argv[0]'s)."""
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(resolv), *argv]
