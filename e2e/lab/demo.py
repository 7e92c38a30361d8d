"""`make demo`: Pagoda as a user installs and uses it, on one machine.

1. starts the local cluster exactly as `make cluster-up` does (control plane, kwok, the local registry with
   Pagoda's images and chart, the real node, KEDA, Prometheus, kube-state-metrics) and installs Pagoda with
   `helm install oci://...` from that registry; it stays up, `make cluster-down` stops it,
2. applies examples/tiny-cpu.yaml unchanged (`kubectl apply -f`) and waits until the service is Ready: its
   pod runs on the real node from the CPU runtime image (the real vLLM engine, CPU backend),
3. `kubectl port-forward` to the service's Service and a chat request through it with the official `openai`
   client, then the runtime's `kubectl logs`.
"""

from __future__ import annotations

import sys
import urllib.request

import yaml

from e2e.lab import __main__ as cluster_cli
from e2e.lab import cluster as control_plane
from e2e.lab.processes import REPO_ROOT, SAMPLE
from e2e.lab.realpods import port_forward
from pagoda.contract import HTTP_PORT

DEV = control_plane.DEV_DIR
NAMESPACE = yaml.safe_load(SAMPLE.read_text())["metadata"]["namespace"]


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def start_control_plane() -> control_plane.Cluster:
    say("Starting the local cluster (control plane, registry, real node, add-ons) and `helm install` Pagoda")
    if cluster_cli.main(["up"]) != 0:
        raise RuntimeError("`make cluster-up` failed: its error is above")
    cluster = control_plane.Cluster.load_state(DEV / "cluster")
    if cluster is None:
        raise RuntimeError("The control plane did not record its state; see .pagoda-dev/cluster/logs")
    return cluster


def apply_sample(cluster: control_plane.Cluster) -> str:
    say(f"Applying {SAMPLE.relative_to(REPO_ROOT)}")
    cluster.kubectl("apply", "-f", str(SAMPLE))
    name = cluster.kubectl(
        "get", "-n", NAMESPACE, "-f", str(SAMPLE), "-o", "jsonpath={.metadata.name}"
    ).stdout
    cluster.kubectl(
        "wait",
        "-n",
        NAMESPACE,
        f"inferenceservice/{name}",
        "--for=condition=Ready",
        "--timeout=420s",
        timeout=430,
    )
    print(cluster.kubectl("get", "-n", NAMESPACE, "inferenceservices").stdout)
    kinds = "deployments,services,poddisruptionbudgets,scaledobjects.keda.sh,pods"
    print(cluster.kubectl("get", "-n", NAMESPACE, kinds, "-l", f"pagoda.dev/inferenceservice={name}").stdout)
    return name


def chat_through_the_service(cluster: control_plane.Cluster, name: str) -> None:
    """`kubectl port-forward svc/NAME`, a chat request through it, the pod's metrics, its `kubectl logs`."""
    say(f"kubectl port-forward service/{name} <a free port>:{HTTP_PORT}")
    with port_forward(cluster, NAMESPACE, f"service/{name}", HTTP_PORT) as base:
        from openai import OpenAI

        client = OpenAI(base_url=f"{base}/v1", api_key="demo")
        question = "Hello! Who are you?"
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": question}], max_tokens=24
        )
        say("A real chat request answered through the Service (random weights, so the words are noise)")
        print(f"user:      {question}")
        print(f"assistant: {reply.choices[0].message.content!r}")
        print(f"usage:     {reply.usage}")
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            lines = response.read().decode().splitlines()
        print("\n".join(line for line in lines if line.startswith("pagoda_")))
    say(f"kubectl logs deployment/{name} --tail=15")
    print(cluster.kubectl("logs", "-n", NAMESPACE, f"deployment/{name}", "--tail=15").stdout)


def main() -> int:
    cluster = start_control_plane()
    name = apply_sample(cluster)
    chat_through_the_service(cluster, name)
    say("Done. The cluster, the operator and the service are still up for you to explore:")
    print(f"  export KUBECONFIG={DEV / 'kubeconfig'}")
    print(f"  {cluster.bin_dir / 'kubectl'} get inferenceservices,pods -n {NAMESPACE} -o wide")
    print("  make cluster-down   # stops everything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
