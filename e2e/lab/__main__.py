"""`make cluster-up` / `make cluster-down`: the local cluster of e2e/lab/cluster.py with the add-ons
(e2e/lab/stack.py) and Pagoda installed, detached, for people (tests start private ones: e2e/fixtures.py).

    python -m e2e.lab up      # kubeconfig at .pagoda-dev/kubeconfig
    python -m e2e.lab up --nodes 2   # with a second real node, pagoda-kubelet-1
    python -m e2e.lab down
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from e2e.lab import realnode
from e2e.lab.addons import wait_established
from e2e.lab.cluster import DEV_DIR, Cluster, ToolsMissingError, default_bin_dir, install_operator, start
from e2e.lab.processes import REPO_ROOT, Launcher, StartError, all_alive, free_ports
from e2e.lab.stack import start_stack


def _cmd_up(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    existing = Cluster.load_state(workdir)
    if existing is not None and all(
        all_alive(pids, existing.bin_dir) for pids in (existing.pids, *existing.node_pids.values())
    ):
        print(f"The local control plane is already running at {existing.server}.")
        _print_usage(existing, Path(args.kubeconfig))
        return 0
    if existing is not None:
        existing.stop()
    # A new cluster each time: etcd's data from the last one holds objects signed by the old keys.
    shutil.rmtree(workdir / "etcd", ignore_errors=True)
    began = time.monotonic()
    cluster = start(workdir, detach=True, real_node=args.real_node, nodes=args.nodes)
    if cluster.node is not None:  # the add-ons' Prometheus is a pod of the Prometheus Operator's
        try:
            stack = start_stack(cluster, detach=True)
        except BaseException:
            cluster.stop()
            raise
        cluster.pids.update(stack.pids)
        cluster.urls.update(
            {
                "prometheus": stack.prometheus_url,
                "kube-state-metrics": stack.addons.kube_state_metrics.metrics_url,
            }
        )
    cluster.save_state()
    if cluster.node is not None:
        install_operator(cluster)
    else:
        start_operator(cluster)
    link = Path(args.kubeconfig)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.write_text(cluster.kubeconfig.read_text())
    print(f"Started the local cluster at {cluster.server} in {time.monotonic() - began:.1f}s.")
    print(f"Logs and PIDs are in {workdir}.")
    _print_usage(cluster, link)
    return 0


def start_operator(cluster: Cluster, timeout: float = 60.0) -> None:
    """Without a real node: installs the InferenceService CRD and runs `pagoda-operator` as a process."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO_ROOT / "crds"))
    wait_established(cluster, ["crd/inferenceservices.pagoda.dev"], timeout)
    launcher = Launcher(cluster.bin_dir, cluster.workdir / "logs", detach=True)
    (port,) = free_ports(1)
    args = [f"--kubeconfig={cluster.kubeconfig}", "--metrics-host=127.0.0.1", f"--metrics-port={port}"]
    cluster.pids["pagoda-operator"] = launcher.launch("pagoda-operator", args)
    cluster.urls["pagoda-operator"] = f"http://127.0.0.1:{port}/metrics"
    cluster.save_state()
    launcher.wait_http("pagoda-operator", f"http://127.0.0.1:{port}/healthz", time.monotonic() + timeout)


def _print_usage(cluster: Cluster, kubeconfig: Path) -> None:
    kubectl = default_bin_dir() / "kubectl"
    print(f"  kube-apiserver      {cluster.server}")
    for name, url in cluster.urls.items():
        print(f"  {name:<19} {url}")
    if cluster.node is not None:
        print(
            f"  real node           {realnode.NODE_NAME} at {cluster.node.address}: kubelet, containerd, "
            f"kube-proxy (label {realnode.NODE_LABEL}; config in {cluster.workdir}/node)"
        )
    for name, net in cluster.more_nodes.items():
        print(
            f"  real node           {name} at {net.address}: kubelet, containerd (config in "
            f"{realnode.NodePaths.of(net).root}; node 0's kube-proxy, DNS and NetworkPolicy agent)"
        )
    if cluster.node is not None:
        print(f"  cluster DNS         CoreDNS at {cluster.node.address}:53 (nothing forwarded)")
        print("  prometheus (pods)   http://prometheus-operated.monitoring.svc:9090 (Prometheus Operator)")
        print("  KEDA                operator + metrics adapter (APIService v1beta1.external.metrics.k8s.io)")
    else:
        print("  (no KEDA, kube-state-metrics or Prometheus: the add-ons need the real node)")
    print(f"\n  export KUBECONFIG={kubeconfig}")
    print(f"  {kubectl} get nodes -o wide  # {realnode.NODE_NAME} (real pods) and two tainted kwok nodes")
    print(f"  {kubectl} apply -f examples/tiny-cpu.yaml   # a pod on the real node that serves chat")
    print("  make cluster-down         # stops it all")


def _cmd_down(args: argparse.Namespace) -> int:
    cluster = Cluster.load_state(Path(args.workdir))
    if cluster is None:
        print("No local control plane is recorded as running.")
        return 0
    cluster.stop()
    Path(args.kubeconfig).unlink(missing_ok=True)
    print(f"Stopped the local control plane ({cluster.server}).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.lab", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--workdir", default=str(DEV_DIR / "cluster"), help="state, logs, data")
    parser.add_argument("--kubeconfig", default=str(DEV_DIR / "kubeconfig"), help="where `up` writes it")
    parser.add_argument(
        "--no-real-node",
        dest="real_node",
        action="store_false",
        help="`up` without the real node, the registry and the add-ons (one real cluster per machine: "
        "e2e/lab/realnode.py)",
    )
    parser.add_argument(
        "--nodes",
        type=int,
        choices=(1, 2),
        default=1,
        help="`up` with this many real nodes (2: pagoda-kubelet-1 too, with the runtime image pre-pulled)",
    )
    args = parser.parse_args(argv)
    if args.nodes > 1 and not args.real_node:
        parser.error("--nodes 2 needs the real node (leave out --no-real-node)")
    try:
        return _cmd_up(args) if args.command == "up" else _cmd_down(args)
    except (ToolsMissingError, StartError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
