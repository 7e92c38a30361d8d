"""`make demo`: the whole of Pagoda on one machine, in about two minutes once installed.

1. starts the local control plane (as `make cluster-up`; it stays up, `make cluster-down` stops it),
2. installs the InferenceService CRD and runs the operator against it,
3. applies examples/tiny-cpu.yaml and waits until the service is Ready on the fake GPU nodes (kwok),
4. writes the tiny local model, starts the Pagoda runtime on it (the real vLLM engine, CPU backend)
   and sends it a real chat request through the official `openai` client,
5. stops the runtime with SIGTERM (graceful drain) and the operator.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from e2e import cluster as control_plane
from e2e.processes import VENV_BIN, ManagedProcess, OperatorProcess, free_port, runtime_env

REPO = control_plane.REPO_ROOT
DEV = control_plane.DEV_DIR
SAMPLE = REPO / "examples" / "tiny-cpu.yaml"
NAMESPACE = yaml.safe_load(SAMPLE.read_text())["metadata"]["namespace"]


def say(message: str) -> None:
    print(f"\n==> {message}", flush=True)


def start_control_plane() -> control_plane.Cluster:
    say("Starting the local control plane (etcd, kube-apiserver, controller-manager, scheduler, kwok)")
    control_plane.main(["up"])
    cluster = control_plane.Cluster.load_state(DEV / "cluster")
    if cluster is None:
        raise RuntimeError("The control plane did not record its state; see .pagoda-dev/cluster/logs")
    return cluster


def run_operator(cluster: control_plane.Cluster, log: Path) -> OperatorProcess:
    say("Installing the CRD and starting the operator")
    cluster.kubectl("apply", "--server-side", "-f", str(REPO / "crds"))
    cluster.kubectl(
        "wait", "--for=condition=Established", "crd/inferenceservices.pagoda.dev", "--timeout=60s"
    )
    operator = OperatorProcess(cluster.kubeconfig, log).start()  # /healthz and /metrics on loopback
    assert operator.proc is not None
    print(f"Operator running (pid {operator.proc.pid}, log {log})")
    return operator


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
        "--timeout=120s",
        timeout=130,
    )
    print(cluster.kubectl("get", "-n", NAMESPACE, "inferenceservices").stdout)
    kinds = "deployments,services,poddisruptionbudgets,scaledobjects.keda.sh,pods"
    print(cluster.kubectl("get", "-n", NAMESPACE, kinds, "-l", f"pagoda.dev/inferenceservice={name}").stdout)
    return name


def chat_with_runtime(workdir: Path) -> None:
    model_dir = workdir / "tiny-model"
    say(f"Writing the tiny local model to {model_dir}")
    subprocess.run([str(VENV_BIN / "pagoda-runtime"), "make-tiny-model", str(model_dir)], check=True)
    port = free_port()
    say(f"Starting the Pagoda runtime on 127.0.0.1:{port} (vLLM engine, CPU backend)")
    runtime = ManagedProcess(workdir / "runtime.log", name="pagoda-runtime")
    runtime.launch(
        [
            str(VENV_BIN / "pagoda-runtime"),
            "serve",
            "--model",
            f"file://{model_dir}",
            "--served-model-name",
            "tiny",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-model-len",
            "512",
            "--drain-timeout",
            "20",
            "--",
            "--enforce-eager",
        ],
        env=runtime_env(workdir),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        runtime.wait_answers(f"{base}/readyz", "the runtime's /readyz", timeout=300, interval=0.5)
        from openai import OpenAI

        client = OpenAI(base_url=f"{base}/v1", api_key="demo")
        question = "Hello! Who are you?"
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": question}], max_tokens=24
        )
        say("A real chat request answered by the runtime (random weights, so the words are noise)")
        print(f"user:      {question}")
        print(f"assistant: {reply.choices[0].message.content!r}")
        print(f"usage:     {reply.usage}")
        with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
            lines = response.read().decode().splitlines()
        print("\n".join(line for line in lines if line.startswith("pagoda_")))
    finally:
        say("Stopping the runtime with SIGTERM (graceful drain)")
        rc = runtime.stop(timeout=90)
        print(f"Runtime exited with code {rc} (log {runtime.log_path})")


def main() -> int:
    workdir = DEV / "demo"
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = start_control_plane()
    operator = run_operator(cluster, workdir / "operator.log")
    try:
        apply_sample(cluster)
        chat_with_runtime(workdir)
    finally:
        operator.stop()
    say("Done. The control plane is still up for you to explore:")
    print(f"  export KUBECONFIG={DEV / 'kubeconfig'}")
    print(f"  {cluster.bin_dir / 'kubectl'} get inferenceservices -n {NAMESPACE}")
    print("  make cluster-down   # stops it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
