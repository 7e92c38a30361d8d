"""`make demo`: the whole of Pagoda on one machine, in about two minutes once installed.

1. starts the local cluster exactly as `make cluster-up` does (control plane, kwok, the node agent, KEDA,
   Prometheus, kube-state-metrics, the CRD and the operator); it stays up, `make cluster-down` stops it,
2. applies examples/tiny-cpu.yaml (`kubectl apply -f`) and waits until the service is Ready: its pod runs
   on the node agent's node as a real `pagoda-runtime` process (the real vLLM engine, CPU backend) with
   its own pod IP,
3. sends a real chat request to that pod IP through the official `openai` client.
"""

from __future__ import annotations

import json
import sys
import urllib.request

import yaml

from e2e import cluster as control_plane

REPO = control_plane.REPO_ROOT
DEV = control_plane.DEV_DIR
SAMPLE = REPO / "examples" / "tiny-cpu.yaml"
NAMESPACE = yaml.safe_load(SAMPLE.read_text())["metadata"]["namespace"]


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def start_control_plane() -> control_plane.Cluster:
    say("Starting the local cluster (control plane, kwok, the node agent and the add-ons)")
    control_plane.main(["up"])
    cluster = control_plane.Cluster.load_state(DEV / "cluster")
    if cluster is None:
        raise RuntimeError("The control plane did not record its state; see .pagoda-dev/cluster/logs")
    return cluster


def apply_sample(cluster: control_plane.Cluster) -> str:
    say(f"Applying {SAMPLE.relative_to(REPO)}")
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


def chat_with_pod(cluster: control_plane.Cluster, name: str) -> None:
    """A chat request to the pod the operator made, at its pod IP (a real runtime run by the node agent)."""
    pods = json.loads(
        cluster.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", f"pagoda.dev/inferenceservice={name}", "-o", "json"
        ).stdout
    )["items"]
    pod = next(p for p in pods if p["status"].get("podIP") and not p["metadata"].get("deletionTimestamp"))
    base = f"http://{pod['status']['podIP']}:8000"
    say(f"Sending a chat request to pod {pod['metadata']['name']} at {base} (vLLM engine, CPU backend)")
    from openai import OpenAI

    client = OpenAI(base_url=f"{base}/v1", api_key="demo")
    question = "Hello! Who are you?"
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": question}], max_tokens=24
    )
    say("A real chat request answered by the pod (random weights, so the words are noise)")
    print(f"user:      {question}")
    print(f"assistant: {reply.choices[0].message.content!r}")
    print(f"usage:     {reply.usage}")
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    print("\n".join(line for line in lines if line.startswith("pagoda_")))


def main() -> int:
    cluster = start_control_plane()
    name = apply_sample(cluster)
    chat_with_pod(cluster, name)
    say("Done. The cluster, the operator and the service are still up for you to explore:")
    print(f"  export KUBECONFIG={DEV / 'kubeconfig'}")
    print(f"  {cluster.bin_dir / 'kubectl'} get inferenceservices,pods -n {NAMESPACE} -o wide")
    print("  make cluster-down   # stops everything")
    return 0


if __name__ == "__main__":
    sys.exit(main())
