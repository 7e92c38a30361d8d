"""PromQL against a Prometheus; a Prometheus of its own (Debian's `prometheus` binary) on loopback, for
`python -m e2e.lab.dashboard_images`, which runs without a cluster; a real runtime to scrape, and load for it.
The e2e tests query the cluster's Prometheus, the Prometheus Operator's (e2e/lab/prometheus_operator.py).

Prometheus runs with a private config and data dir (not the Debian service). Targets are given through a
file_sd file, so they can be added while it runs. Each target carries the labels the Prometheus Operator
puts on a ServiceMonitor's targets (`job`, `namespace`, `service`, `pod`, `endpoint`), so the dashboards'
and alerts' queries run here exactly as they would in a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from e2e.lab.processes import REPO_ROOT, VENV_BIN, ManagedProcess, free_port, runtime_env, wait_until

SCRAPE_INTERVAL = "1s"
# What Grafana's $__rate_interval becomes for a 1s scrape interval and a short dashboard range.
RATE_INTERVAL = "20s"
# The target labels of the runtime's and the operator's ServiceMonitors, as the Prometheus Operator sets them.
RUNTIME_LABELS = {"namespace": "ml", "service": "tiny", "pod": "tiny-7d9f-abcde", "endpoint": "http"}
OPERATOR_LABELS = {
    "namespace": "pagoda-system",
    "service": "pagoda-metrics",
    "pod": "pagoda-5c6d-xyz",
    "endpoint": "metrics",
}


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or (
        "/usr/bin/prometheus" if os.access("/usr/bin/prometheus", os.X_OK) else None
    )
    if not found:
        raise AssertionError("prometheus not found: `make test` installs Debian's prometheus package")
    return found


class PromQLError(AssertionError):
    pass


class PromQL:
    """Prometheus' HTTP API at `self.url`: queries that raise PromQLError with the server's message."""

    url: str

    def api(self, path: str, **params: str) -> Any:
        response = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=30)
        body = response.json()
        if body.get("status") != "success":
            raise PromQLError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query, now or at the Unix time `at`."""
        data = self.api("query", query=expr, **({} if at is None else {"time": f"{at:.3f}"}))
        result: list[dict[str, Any]] = data["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: str = "2s") -> list[dict[str, Any]]:
        data = self.api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step)
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": match})
        return values


@dataclass
class PrometheusAt(PromQL):
    """A Prometheus someone else runs (the Prometheus Operator's, e2e/lab/prometheus_operator.py)."""

    url: str


@dataclass
class Prometheus(ManagedProcess, PromQL):
    workdir: Path
    port: int = field(default_factory=free_port)
    rule_files: list[Path] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)
    static_targets: list[dict[str, Any]] = field(default_factory=list)

    name = "prometheus"
    LOG_NAME = "prometheus.log"

    def start(self) -> Prometheus:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_targets()
        config = {
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(path) for path in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": "pagoda",
                    "file_sd_configs": [
                        {"files": [str(self.workdir / "targets.json")], "refresh_interval": "1s"}
                    ],
                    # The Prometheus Operator sets `job` to the Service's name (file_sd cannot set it).
                    "relabel_configs": [{"source_labels": ["__job"], "target_label": "job"}],
                },
                {
                    # Exporters whose series name their objects' namespace themselves (kube-state-metrics),
                    # kept as kube-prometheus-stack keeps them (honorLabels).
                    "job_name": "static",
                    "honor_labels": True,
                    "file_sd_configs": [
                        {"files": [str(self.workdir / "static-targets.json")], "refresh_interval": "1s"}
                    ],
                    "relabel_configs": [{"source_labels": ["__job"], "target_label": "job"}],
                },
            ],
        }
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.launch(
            [
                prometheus_binary(),
                f"--config.file={self.workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ]
        )
        self.wait_answers(f"{self.url}/-/ready", "Prometheus /-/ready", timeout=60)
        return self

    def _write_targets(self) -> None:
        for name, targets in (("targets.json", self.targets), ("static-targets.json", self.static_targets)):
            tmp = self.workdir / f"{name}.tmp"
            tmp.write_text(json.dumps(targets))
            tmp.replace(self.workdir / name)  # atomic: Prometheus never reads half a file

    def add_target(self, address: str, *, namespace: str, service: str, pod: str, endpoint: str) -> None:
        """Scrape `address` with the labels a ServiceMonitor's target gets from the Prometheus Operator."""
        labels = {
            "__job": service,
            "namespace": namespace,
            "service": service,
            "pod": pod,
            "endpoint": endpoint,
        }
        self.targets.append({"targets": [address], "labels": labels})
        self._write_targets()
        wait_until(lambda: self._target_up(address), f"Prometheus to scrape {address}", timeout=60)

    def add_static_target(self, address: str, job: str) -> None:
        """Scrape `address` as `job`, keeping the labels its series carry (honor_labels)."""
        self.static_targets.append({"targets": [address], "labels": {"__job": job}})
        self._write_targets()
        wait_until(lambda: self._target_up(address), f"Prometheus to scrape {address}", timeout=60)

    def _target_up(self, address: str) -> bool:
        active = self.api("targets")["activeTargets"]
        return any(t["scrapeUrl"].startswith(f"http://{address}/") and t["health"] == "up" for t in active)


DASHBOARDS = REPO_ROOT / "charts" / "pagoda" / "files" / "dashboards"
KUBE_STATE_METRICS = ("kube_deployment_spec_replicas", "kube_deployment_status_replicas_ready")


def dashboard(name: str) -> dict[str, Any]:
    board: dict[str, Any] = json.loads((DASHBOARDS / f"{name}.json").read_text())
    return board


def resolve_variables(
    prom: PromQL, board: dict[str, Any], choose: dict[str, str] | None = None
) -> dict[str, str]:
    """Resolve namespace, then service, with the dashboard's own label_values() queries, as Grafana does:
    each variable takes the value `choose` gives it, which its query must offer (a Prometheus that scrapes
    a whole cluster offers many), or else the first value offered."""
    chosen: dict[str, str] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] != "query":
            continue
        definition = variable["definition"]
        for name, value in chosen.items():
            definition = definition.replace(f"${name}", value)
        selector, label = definition.removeprefix("label_values(").removesuffix(")").rsplit(",", 1)
        values = prom.label_values(label.strip(), selector.strip())
        assert values, f"variable {variable['name']}: {definition} returned nothing"
        wanted = (choose or {}).get(variable["name"])
        assert wanted is None or wanted in values, f"variable {variable['name']}: {wanted} not in {values}"
        chosen[variable["name"]] = wanted or sorted(values)[0]
    return chosen


def panel_queries(board: dict[str, Any], variables: dict[str, str]) -> list[tuple[str, str, str]]:
    """(panel title, legend, query with variables substituted) for every target."""
    out = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", RATE_INTERVAL)
            for name, value in variables.items():
                expr = expr.replace(f"${name}", value)
            out.append((panel["title"], target.get("legendFormat", ""), expr))
    return out


@dataclass
class Runtime(ManagedProcess):
    """`pagoda-runtime serve` on the tiny model, as a subprocess on a free loopback port."""

    model_dir: Path
    workdir: Path
    served_name: str = "tiny"
    port: int = field(default_factory=free_port)

    name = "pagoda-runtime"
    STOP_GRACE = 60.0
    LOG_NAME = "runtime.log"

    def start(self, timeout: float = 300) -> Runtime:
        self.workdir.mkdir(parents=True, exist_ok=True)
        args = [str(VENV_BIN / "pagoda-runtime"), "serve", "--model", f"file://{self.model_dir}"]
        args += ["--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port)]
        args += ["--cache-dir", str(self.workdir / "cache"), "--dtype", "float32", "--max-model-len", "1024"]
        args += ["--max-num-seqs", "4", "--enable-prefix-caching", "--", "--enforce-eager"]
        # Small KV blocks, so that the shared system prompt fills whole blocks the prefix cache can reuse
        # (given to vLLM directly: the runtime's own --block-size rejects every value, see the chart report).
        args += ["--block-size", "32"]
        self.launch(args, env=runtime_env(self.workdir))
        self.wait_answers(f"{self.url}/readyz", "the runtime's /readyz", timeout=timeout, interval=0.5)
        return self


SHARED_PREFIX = (
    "You are a concise assistant for a team that runs language models on Kubernetes. Answer in one short "
    "sentence, without lists, and never repeat the question. The team serves several models behind one "
    "gateway, scales them on queue depth, and watches time to first token, inter-token latency and the "
    "KV cache on its dashboards. "
)


@dataclass
class Record:
    """One request of a Load: when it started, got its first token and ended (monotonic seconds), where it
    went, its failure (None: HTTP 200 and the whole stream read) and the tokens it generated (the stream's
    usage, None when the stream did not report it)."""

    started: float
    first_token: float | None
    ended: float
    endpoint: str
    failure: str | None
    tokens: int | None = None


class Load:
    """`clients` threads sending streamed chat requests back to back until stopped, each to the base URL
    that `target` gives (a fixed URL, or a callable that picks one per request, as a Service would).

    The prompts share a long system prefix, so the prefix cache gets hits; there are more clients than
    the engine's max-num-seqs, so requests queue. Each client waits `pause` seconds between its requests (a
    light, steady load). Bounded: at most `max_requests` requests and `max_seconds` seconds in all, whatever
    the caller does. `body(client, n)`, when given, makes each request's messages and extra fields instead
    (benchmarks/bench_slo_ramp.py: prompts of a fixed length, no shared prefix, every token generated)."""

    def __init__(
        self,
        target: str | Callable[[], str],
        model: str,
        clients: int = 6,
        max_tokens: int = 24,
        max_requests: int = 20_000,
        max_seconds: float = 1200.0,
        pause: float = 0.0,
        body: Callable[[int, int], dict[str, Any]] | None = None,
    ) -> None:
        self.pick = target if callable(target) else (lambda: target)
        self.body = body
        self.model, self.clients, self.max_tokens = model, clients, max_tokens
        self.max_requests, self.max_seconds, self.pause = max_requests, max_seconds, pause
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.records: list[Record] = []
        self.in_flight = 0  # requests open right now
        self.open_since: dict[int, float] = {}  # client -> when its open request started
        self._lock = threading.Lock()

    @property
    def completed(self) -> int:
        return sum(1 for r in self.records if r.failure is None)

    def oldest_open(self) -> float:
        """When the oldest request still open started (monotonic; infinity when none is open)."""
        with self._lock:
            return min(self.open_since.values(), default=float("inf"))

    def tokens_between(self, start: float, end: float) -> float:
        """Tokens generated between the monotonic times `start` and `end`, from each finished request's own
        count, spread evenly from its first token to its end (a request overlapping an edge counts in part).
        Requests still open at `end` are not counted: call it once they have finished."""
        total = 0.0
        with self._lock:
            records = list(self.records)
        for r in records:
            if r.failure is not None or r.tokens is None or r.first_token is None:
                continue
            if r.ended <= r.first_token:
                total += r.tokens if start <= r.ended <= end else 0
                continue
            overlap = min(end, r.ended) - max(start, r.first_token)
            total += r.tokens * max(0.0, overlap) / (r.ended - r.first_token)
        return total

    @property
    def failures(self) -> list[str]:
        return [f"{r.endpoint}: {r.failure}" for r in self.records if r.failure is not None]

    def _request(self, http: httpx.Client, index: int, n: int) -> Record:
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": SHARED_PREFIX},
                {"role": "user", "content": f"Client {index}, question {n}: what is a GPU?"},
            ],
            "max_tokens": self.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},  # a last chunk with the generated token count
        }
        if self.body is not None:
            body.update(self.body(index, n))
        endpoint = self.pick()
        started, first, tokens = time.monotonic(), None, None
        try:
            with http.stream("POST", f"{endpoint}/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if first is None and line.startswith("data: {"):
                        first = time.monotonic()
                    if line.startswith("data: {") and '"completion_tokens"' in line:
                        tokens = int(json.loads(line.removeprefix("data: "))["usage"]["completion_tokens"])
                failure = None if response.status_code == 200 else f"HTTP {response.status_code}"
        except httpx.HTTPError as exc:
            failure = repr(exc)
        return Record(started, first, time.monotonic(), endpoint, failure, tokens)

    def _client(self, index: int) -> None:
        end = time.monotonic() + self.max_seconds
        with httpx.Client(timeout=120) as http:
            n = 0
            while not self.stop_event.is_set() and time.monotonic() < end:
                with self._lock:
                    if len(self.records) >= self.max_requests:
                        return
                    self.in_flight += 1
                    self.open_since[index] = time.monotonic()
                n += 1
                record = self._request(http, index, n)
                with self._lock:
                    self.in_flight -= 1
                    del self.open_since[index]
                    self.records.append(record)
                self.stop_event.wait(self.pause)

    def start(self) -> Load:
        for index in range(self.clients):
            thread = threading.Thread(target=self._client, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=180)
