"""A node agent that runs Pods as local processes: what a kubelet does for Pagoda's pods, and no more.
Test harness like kwok, not product code. kwok simulates the fake GPU nodes; this agent serves one node whose
pods really run, each in a network namespace of its own with an address on the agent's bridge (e2e/podnet.py).

    python -m e2e.nodeagent --kubeconfig K --node NAME --state-dir DIR --models-dir MODELS --path VENV/bin

What it does:
- registers the node (with `nvidia.com/gpu` capacity, so GPU pods schedule here unchanged), renews its Lease
  and keeps its Ready condition fresh;
- for each Pod bound to the node: a network namespace and pod IP, then the first container's `command` +
  `args` + `env` exactly as the Pod says (the image's paths mapped to host folders, see IMAGE below);
  `status.podIP`, phase, `containerStatuses` (state, restartCount, lastState.terminated with exit code and the
  termination message file), and the Ready condition from the pod's own readiness probe;
- startup, liveness and readiness probes with the Pod's timings (httpGet and tcpSocket); the container is
  restarted when the startup or liveness probe says so or when it exits (restartPolicy, back-off 10 s doubling
  to 5 min, as the kubelet);
- on deletion: preStop (sleep or httpGet), SIGTERM, up to terminationGracePeriodSeconds, SIGKILL to everything
  in the pod's namespace, then the Pod object is removed;
- leaves nothing behind: names share a prefix, and a sweep at start removes what a killed agent left.

What it does not do: images (IMAGE maps the Pagoda runtime image onto this machine), resource limits,
user ids (processes run as the agent's user), exec probes, init or sidecar containers, `kubectl logs` (each
container's output is in STATE_DIR/pods/<namespace>_<name>/<container>.log).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from e2e._objects import request
from e2e.podnet import PodNetwork, kill_netns_processes, setns_net

Obj = dict[str, Any]

# The Pagoda runtime image (runtime/Dockerfile) on this machine: its environment, and its folders as host
# folders. Volume mounts, the termination message file and these image paths are rewritten in the
# container's args and env values wherever they appear as a path (`/x/...`, `file:///x/...`, `--flag=/x/...`).
IMAGE_ENV = {
    "VLLM_CACHE_ROOT": "/var/cache/pagoda/vllm",
    "HF_HOME": "/var/cache/pagoda/hf",
    "VLLM_NO_USAGE_STATS": "1",
    "PYTHONUNBUFFERED": "1",
    "HF_HUB_OFFLINE": "1",  # nodes here reach no model hub
}
MODELS_IN_IMAGE = "/models"  # -> --models-dir (`pagoda-runtime make-tiny-model MODELS/tiny` writes there)
NODE_CAPACITY = {
    "cpu": "16",
    "memory": "64Gi",
    "pods": "32",
    "nvidia.com/gpu": "4",
    "ephemeral-storage": "100Gi",
}
# The node's label and taint (both "true"): only pods that select it and tolerate it run here for real.
NODE_LABEL = "pagoda.dev/node-agent"
LEASE_SECONDS = 40
BACKOFF_START, BACKOFF_MAX, BACKOFF_RESET = 10.0, 300.0, 600.0
TICK = 0.2


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def map_paths(value: str, table: dict[str, str]) -> str:
    """`value` with every container path in `table` (longest first) replaced by its host folder, where the
    path stands at the start, after `file://` or after `=`, and is followed by `/` or the end."""
    for container_path in sorted(table, key=len, reverse=True):
        pattern = rf"(^|file://|=){re.escape(container_path)}(?=/|$)"
        value = re.sub(pattern, lambda m, p=container_path: m.group(1) + table[p], value)
    return value


@dataclass
class Probe:
    """One probe's schedule and counters (kubelet semantics: consecutive successes/failures)."""

    spec: Obj
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0

    def reset(self, started: float) -> None:
        self.successes = self.failures = 0
        self.next_at = started + self.spec.get("initialDelaySeconds", 0)

    def due(self, at: float) -> bool:
        return at >= self.next_at

    def record(self, ok: bool, at: float) -> str | None:
        """Counts a result; returns "success" or "failure" when a threshold is crossed."""
        self.next_at = at + self.spec.get("periodSeconds", 10)
        if ok:
            self.failures = 0
            self.successes += 1
            return "success" if self.successes >= self.spec.get("successThreshold", 1) else None
        self.successes = 0
        self.failures += 1
        return "failure" if self.failures >= self.spec.get("failureThreshold", 3) else None


def run_probe(spec: Obj, pod_ip: str, ports: dict[str, int]) -> bool:
    timeout = float(spec.get("timeoutSeconds", 1))
    if "httpGet" in spec:
        return http_get(spec["httpGet"], pod_ip, ports, timeout)
    if "tcpSocket" in spec:
        port = resolve_port(spec["tcpSocket"]["port"], ports)
        try:
            socket.create_connection((pod_ip, port), timeout=timeout).close()
            return True
        except OSError:
            return False
    raise NotImplementedError(f"The node agent runs httpGet and tcpSocket probes only, not {sorted(spec)}.")


def resolve_port(port: int | str, ports: dict[str, int]) -> int:
    return ports[port] if isinstance(port, str) else int(port)


def http_get(action: Obj, pod_ip: str, ports: dict[str, int], timeout: float) -> bool:
    """A kubelet-style HTTP probe: success is a status in [200, 400)."""
    conn = http.client.HTTPConnection(pod_ip, resolve_port(action["port"], ports), timeout=timeout)
    try:
        conn.request("GET", action.get("path", "/"))
        return 200 <= conn.getresponse().status < 400
    except OSError:
        return False
    finally:
        conn.close()


class PodWorker(threading.Thread):
    """Runs one Pod: its namespace, its (first) container with restarts and probes, its status, its end."""

    def __init__(self, agent: NodeAgent, pod: Obj) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.agent, self.pod = agent, pod
        self.namespace, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.dir = agent.state_dir / "pods" / f"{self.namespace}_{self.name}"
        self.wake = threading.Event()
        self.container: Obj = pod["spec"]["containers"][0]
        self.ports = {p["name"]: p["containerPort"] for p in self.container.get("ports", []) if "name" in p}
        self.probes = {
            k: Probe(self.container[k])
            for k in ("startupProbe", "livenessProbe", "readinessProbe")
            if k in self.container
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.netns = self.pod_ip = ""
        self.started_at = ""
        self.started = self.ready = False
        self.restarts = 0
        self.last_terminated: Obj | None = None
        self.waiting: Obj | None = {"reason": "ContainerCreating"}
        self.backoff, self.restart_at, self.run_began = BACKOFF_START, 0.0, 0.0
        self.published: Obj | None = None
        self.transitions: dict[str, tuple[str, str]] = {}
        self.start_time = pod.get("status", {}).get("startTime") or now()
        self.terminating = False

    # --- the loop -------------------------------------------------------------------------------------
    def update(self, pod: Obj | None) -> None:
        """The watch's latest view of the Pod (None: it is gone)."""
        if pod is None:
            self.pod = {**self.pod, "gone": True}
        else:
            self.pod = pod
        self.wake.set()

    def run(self) -> None:
        try:
            self.netns, self.pod_ip = self.agent.net.add_pod(self.uid[:8])
            self.table = self.path_table()
            self.publish()
            while not self.pod.get("gone") and not self.pod["metadata"].get("deletionTimestamp"):
                self.step()
                self.publish()
                self.wake.wait(TICK)
                self.wake.clear()
            self.terminate()
        except Exception as exc:  # noqa: BLE001 - a harness thread must report, not vanish
            print(f"[{self.name}] node agent error: {exc!r}", file=sys.stderr, flush=True)
            self.kill_all()
        finally:
            self.agent.forget(self.uid)

    def step(self) -> None:
        at = time.monotonic()
        if self.proc is None:
            if at >= self.restart_at:
                self.start_container()
            return
        code = self.proc.poll()
        if code is not None:
            self.container_exited(code)
            return
        if at - self.run_began > BACKOFF_RESET:
            self.backoff = BACKOFF_START
        startup = self.probes.get("startupProbe")
        if not self.started:
            if startup is None:
                self.started = True
            elif startup.due(at):
                verdict = startup.record(self.probe(startup), at)
                if verdict == "success":
                    self.started = True
                elif verdict == "failure":
                    self.restart("startup probe failed")
                return
            else:
                return
        liveness = self.probes.get("livenessProbe")
        if liveness is not None and liveness.due(at):
            if liveness.record(self.probe(liveness), at) == "failure":
                self.restart("liveness probe failed")
                return
        readiness = self.probes.get("readinessProbe")
        if readiness is None:
            self.ready = True
        elif readiness.due(at):
            verdict = readiness.record(self.probe(readiness), at)
            if verdict is not None:
                self.ready = verdict == "success"

    def probe(self, probe: Probe) -> bool:
        return run_probe(probe.spec, self.pod_ip, self.ports)

    # --- the container ---------------------------------------------------------------------------------
    def path_table(self) -> dict[str, str]:
        """Container paths -> host folders: the image's /models, each volume mount, the termination file."""
        table = {MODELS_IN_IMAGE: str(self.agent.models_dir)}
        volumes = {v["name"]: v for v in self.pod["spec"].get("volumes", [])}
        for mount in self.container.get("volumeMounts", []):
            volume = volumes.get(mount["name"], {})
            if "persistentVolumeClaim" in volume:
                host = (
                    self.agent.state_dir
                    / "claims"
                    / self.namespace
                    / volume["persistentVolumeClaim"]["claimName"]
                )
            else:  # emptyDir, ephemeral and the rest: a folder of the pod's own
                host = self.dir / "volumes" / mount["name"]
            host.mkdir(parents=True, exist_ok=True)
            table[mount["mountPath"]] = str(host)
        message_path = self.container.get("terminationMessagePath", "/dev/termination-log")
        table[message_path] = str(self.dir / "termination-log")
        return table

    def environment(self) -> dict[str, str]:
        env = {
            "PATH": f"{self.agent.image_path}:/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.dir / "home"),
            "HOSTNAME": self.name,
            **IMAGE_ENV,
        }
        for source in self.container.get("envFrom", []):
            data = self.agent.read_data(self.namespace, source)
            env.update({source.get("prefix", "") + k: v for k, v in data.items()})
        for var in self.container.get("env", []):
            env[var["name"]] = var["value"] if "value" in var else self.agent.value_from(self.pod, var)
        return {k: map_paths(v, self.table) for k, v in env.items()}

    def start_container(self) -> None:
        (self.dir / "home").mkdir(parents=True, exist_ok=True)
        (self.dir / "termination-log").write_text("")
        argv = [
            map_paths(a, self.table)
            for a in self.container.get("command", []) + self.container.get("args", [])
        ]
        env = self.environment()
        program = shutil.which(argv[0], path=env["PATH"]) or argv[0]
        netns = self.netns
        log = (self.dir / f"{self.container['name']}.log").open("ab")
        try:
            self.proc = subprocess.Popen(
                [program, *argv[1:]],
                env=env,
                cwd=self.container.get("workingDir") or env["HOME"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: setns_net(netns),
            )
        except OSError as exc:
            self.waiting = {"reason": "RunContainerError", "message": str(exc)}
            self.restart_at = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX)
            return
        finally:
            log.close()
        self.started_at, self.run_began = now(), time.monotonic()
        self.waiting, self.started, self.ready = None, False, False
        for probe in self.probes.values():
            probe.reset(self.run_began)

    def restart(self, why: str) -> None:
        """Kills the container (the kubelet's restart after a failed startup or liveness probe)."""
        print(f"[{self.name}] {why}: restarting the container", file=sys.stderr, flush=True)
        self.stop_container(grace=self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    def stop_container(self, grace: float) -> None:
        if self.proc is None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGTERM)  # the container's PID 1 only, as the kubelet
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=max(grace, 0))
        except subprocess.TimeoutExpired:
            pass
        self.kill_all()
        self.container_exited(self.proc.wait())

    def kill_all(self) -> None:
        """SIGKILL the container's process group and then whatever else runs in the pod's namespace."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()
        if self.netns:
            kill_netns_processes(self.netns)

    def container_exited(self, code: int) -> None:
        self.kill_all()  # what the container's main process left running
        self.proc = None
        message = (self.dir / "termination-log").read_text(errors="replace")[:4096].strip()
        policy = self.container.get("terminationMessagePolicy", "File")
        if not message and code != 0 and policy == "FallbackToLogsOnError":
            lines = (self.dir / f"{self.container['name']}.log").read_text(errors="replace").splitlines()
            message = "\n".join(lines[-80:])[-2048:]
        terminated: Obj = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": now(),
        }
        if code < 0:
            terminated["signal"] = -code
        if message:
            terminated["message"] = message
        self.last_terminated = terminated
        self.started = self.ready = False
        policy = self.pod["spec"].get("restartPolicy", "Always")
        if self.terminating or policy == "Never" or (policy == "OnFailure" and code == 0):
            self.waiting = None
            self.restart_at = float("inf")
            return
        self.restarts += 1
        self.waiting = {
            "reason": "CrashLoopBackOff",
            "message": f"back-off {self.backoff:.0f}s restarting failed container={self.container['name']} "
            f"pod={self.name}_{self.namespace}({self.uid})",
        }
        self.restart_at = time.monotonic() + self.backoff
        self.backoff = min(self.backoff * 2, BACKOFF_MAX)

    # --- the end ---------------------------------------------------------------------------------------
    def terminate(self) -> None:
        """preStop, SIGTERM, the grace period, SIGKILL; then remove the namespace and the Pod object."""
        spec = self.pod["spec"]
        grace = float(
            self.pod["metadata"].get(
                "deletionGracePeriodSeconds", spec.get("terminationGracePeriodSeconds", 30)
            )
        )
        deadline = time.monotonic() + grace
        self.terminating = True
        if self.proc is not None and not self.pod.get("gone"):
            self.pre_stop(deadline)
            threading.Thread(target=self.keep_probing, args=(deadline,), daemon=True).start()
            self.stop_container(grace=deadline - time.monotonic())
        self.kill_all()
        self.agent.net.remove_pod(self.uid[:8], self.pod_ip)
        self.netns = ""
        if not self.pod.get("gone"):
            self.publish()
            self.agent.delete_pod(self.namespace, self.name, self.uid)

    def pre_stop(self, deadline: float) -> None:
        hook = self.container.get("lifecycle", {}).get("preStop") or {}
        if "sleep" in hook:
            time.sleep(max(0.0, min(float(hook["sleep"]["seconds"]), deadline - time.monotonic())))
        elif "httpGet" in hook:
            http_get(hook["httpGet"], self.pod_ip, self.ports, timeout=max(1.0, deadline - time.monotonic()))

    def keep_probing(self, deadline: float) -> None:
        """Readiness keeps running while the pod terminates (a draining runtime answers 503 at once)."""
        readiness = self.probes.get("readinessProbe")
        while readiness is not None and self.proc is not None and time.monotonic() < deadline:
            if readiness.due(time.monotonic()):
                if readiness.record(self.probe(readiness), time.monotonic()) == "failure" and self.ready:
                    self.ready = False
                    self.publish()
            time.sleep(TICK)

    # --- status ----------------------------------------------------------------------------------------
    def container_status(self) -> Obj:
        running = self.proc is not None and self.proc.poll() is None
        if running:
            state: Obj = {"running": {"startedAt": self.started_at}}
        elif self.waiting is not None:
            state = {"waiting": self.waiting}
        else:
            state = {"terminated": self.last_terminated or {"exitCode": 0, "reason": "Completed"}}
        status: Obj = {
            "name": self.container["name"],
            "image": self.container.get("image", ""),
            "imageID": "",
            "containerID": f"pagoda-process://{self.proc.pid}" if running and self.proc else "",
            "ready": self.ready and running,
            "started": self.started and running,
            "restartCount": self.restarts,
            "state": state,
            "lastState": {"terminated": self.last_terminated} if self.last_terminated else {},
        }
        return status

    def status(self) -> Obj:
        container = self.container_status()
        ready = "True" if container["ready"] else "False"
        if container["state"].get("terminated") and self.restart_at == float("inf"):
            phase = "Succeeded" if container["state"]["terminated"]["exitCode"] == 0 else "Failed"
        elif container["state"].get("running") or self.restarts:
            phase = "Running"
        else:
            phase = "Pending"
        conditions = [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": ready},
            {"type": "Ready", "status": ready},
        ]
        return {
            "phase": phase,
            "hostIP": self.agent.host_ip,
            "hostIPs": [{"ip": self.agent.host_ip}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}] if self.pod_ip else [],
            "startTime": self.start_time,
            "conditions": conditions,
            "containerStatuses": [container],
        }

    def publish(self) -> None:
        """Writes the status when it changed; a condition's lastTransitionTime moves only when it flips."""
        status = self.status()
        if status == self.published:
            return
        stamped = {**status, "conditions": []}
        for condition in status["conditions"]:
            kind, value = condition["type"], condition["status"]
            if self.transitions.get(kind, ("", ""))[0] != value:
                self.transitions[kind] = (value, now())
            stamped["conditions"].append({**condition, "lastTransitionTime": self.transitions[kind][1]})
        self.agent.patch_pod_status(self.namespace, self.name, stamped)
        self.published = status


class NodeAgent:
    """Registers the node, keeps it alive and runs a PodWorker for each Pod bound to it."""

    def __init__(self, api: Any, node: str, state_dir: Path, models_dir: Path, image_path: str) -> None:
        from kubernetes import client

        self.api, self.node = api, node
        self.core, self.coordination = client.CoreV1Api(api), client.CoordinationV1Api(api)
        self.state_dir, self.models_dir, self.image_path = state_dir, models_dir, image_path
        agent_id = hashlib.sha1(str(state_dir.resolve()).encode()).hexdigest()[:6]
        self.net = PodNetwork(agent_id)
        self.host_ip = str(self.net.gateway)
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    # --- the node ------------------------------------------------------------------------------------------
    def register(self) -> None:
        from kubernetes.client.exceptions import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node,
                "labels": {
                    "kubernetes.io/hostname": self.node,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    NODE_LABEL: "true",
                },
            },
            "spec": {
                "podCIDR": str(self.net.subnet),
                "podCIDRs": [str(self.net.subnet)],
                "taints": [{"key": NODE_LABEL, "value": "true", "effect": "NoSchedule"}],
            },
        }
        try:
            self.core.create_node(node)
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.heartbeat()

    def heartbeat(self) -> None:
        """The node's status (capacity, Ready) and its Lease in kube-node-lease."""
        from kubernetes.client.exceptions import ApiException

        stamp = now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "pagoda node agent",
            "lastHeartbeatTime": stamp,
            "lastTransitionTime": stamp,
        }
        status = {
            "capacity": NODE_CAPACITY,
            "allocatable": NODE_CAPACITY,
            "conditions": [ready],
            "addresses": [
                {"type": "InternalIP", "address": self.host_ip},
                {"type": "Hostname", "address": self.node},
            ],
            "nodeInfo": {
                "kubeletVersion": "pagoda-node-agent",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "process://",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kernelVersion": "",
                "osImage": "",
                "kubeProxyVersion": "",
            },
        }
        self.core.patch_node_status(self.node, {"status": status})
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": now_micro()}
        try:
            self.coordination.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": spec})
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease = {"metadata": {"name": self.node, "namespace": "kube-node-lease"}, "spec": spec}
            self.coordination.create_namespaced_lease("kube-node-lease", lease)

    def keep_alive(self) -> None:
        while not self.stopping.wait(10):
            try:
                self.heartbeat()
            except Exception as exc:  # noqa: BLE001 - the API server may restart; try again next time
                print(f"heartbeat failed: {exc!r}", file=sys.stderr, flush=True)

    # --- pods --------------------------------------------------------------------------------------------
    def run(self) -> None:
        from kubernetes import watch

        self.register()
        threading.Thread(target=self.keep_alive, name="heartbeat", daemon=True).start()
        print(f"node {self.node} registered; pods on {self.net.subnet}", flush=True)
        selector = f"spec.nodeName={self.node}"
        while not self.stopping.is_set():
            listing = self.core.list_pod_for_all_namespaces(field_selector=selector)
            seen = set()
            for item in listing.items:
                pod = self.api.sanitize_for_serialization(item)
                seen.add(pod["metadata"]["uid"])
                self.dispatch(pod)
            with self.lock:
                for uid in set(self.workers) - seen:
                    self.workers[uid].update(None)
            try:
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector=selector,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=300,
                )
                for event in stream:
                    pod = self.api.sanitize_for_serialization(event["object"])
                    if event["type"] == "DELETED":
                        with self.lock:
                            worker = self.workers.get(pod["metadata"]["uid"])
                        if worker is not None:
                            worker.update(None)
                    else:
                        self.dispatch(pod)
            except Exception as exc:  # noqa: BLE001 - expired resource version, API restart: list again
                print(f"watch ended: {exc!r}", file=sys.stderr, flush=True)
                time.sleep(1)

    def dispatch(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        with self.lock:
            worker = self.workers.get(uid)
            if worker is None:
                if pod["metadata"].get("deletionTimestamp") and not pod.get("status", {}).get("podIP"):
                    self.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"], uid)
                    return
                worker = self.workers[uid] = PodWorker(self, pod)
                worker.start()
                return
        worker.update(pod)

    def forget(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)

    def patch_pod_status(self, namespace: str, name: str, status: Obj) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.patch_namespaced_pod_status(name, namespace, {"status": status})
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        """Removes the Pod object once its containers are gone (the kubelet's final, zero-grace delete)."""
        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        status, result = request(self.api, "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", body)
        if status not in (200, 202, 404, 409):
            raise RuntimeError(f"Deleting pod {namespace}/{name} failed ({status}): {result}")

    def read_data(self, namespace: str, source: Obj) -> dict[str, str]:
        """envFrom: a Secret's or ConfigMap's data."""
        import base64

        if "secretRef" in source:
            secret = self.core.read_namespaced_secret(source["secretRef"]["name"], namespace)
            return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        config_map = self.core.read_namespaced_config_map(source["configMapRef"]["name"], namespace)
        return dict(config_map.data or {})

    def value_from(self, pod: Obj, var: Obj) -> str:
        """env[].valueFrom: secretKeyRef, configMapKeyRef, fieldRef (metadata.*, status.podIP)."""
        source = var["valueFrom"]
        namespace = pod["metadata"]["namespace"]
        if "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            return self.read_data(namespace, {"secretRef": ref})[ref["key"]]
        if "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            return self.read_data(namespace, {"configMapRef": ref})[ref["key"]]
        path = source["fieldRef"]["fieldPath"]
        if path == "status.podIP":
            return str(pod.get("status", {}).get("podIP", ""))
        return str(pod["metadata"].get(path.split(".", 1)[1], ""))

    def stop(self) -> None:
        """Ends every pod's processes and namespace (the node stays registered; its pods will be deleted)."""
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.kill_all()
        self.net.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.nodeagent", description=__doc__.split("\n")[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--node", required=True, help="the node's name")
    parser.add_argument("--state-dir", required=True, help="per-pod folders and logs")
    parser.add_argument("--models-dir", required=True, help="the host folder for the image's /models")
    parser.add_argument("--path", required=True, help="where the image's programs are (a venv's bin)")
    args = parser.parse_args(argv)
    from kubernetes import config

    api = config.new_client_from_config(config_file=args.kubeconfig)
    agent = NodeAgent(api, args.node, Path(args.state_dir), Path(args.models_dir), args.path)
    signal.signal(signal.SIGTERM, lambda *_: (agent.stop(), os._exit(0)))
    try:
        agent.run()
    finally:
        agent.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
