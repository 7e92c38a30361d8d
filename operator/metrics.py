"""The operator's Prometheus metrics and its /healthz + /metrics HTTP endpoint (one port)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest

log = logging.getLogger("pagoda.operator.metrics")

RECONCILES = Counter(
    "pagoda_operator_reconciles",
    "Reconcile passes of InferenceServices, by result (applied, unchanged, error).",
    ["result"],
)
RECONCILE_DURATION = Histogram(
    "pagoda_operator_reconcile_duration_seconds",
    "Wall time of one reconcile pass of one InferenceService.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
API_WRITES = Counter(
    "pagoda_operator_api_writes",
    "Writes the operator sent to the Kubernetes API, by object kind and verb.",
    ["kind", "verb"],
)
RECONCILE_ERRORS = Counter(
    "pagoda_operator_reconcile_errors",
    "Reconcile passes that could not fully act on an InferenceService, by reason.",
    ["reason"],
)
QUEUE_DEPTH = Gauge(
    "pagoda_operator_queue_depth",
    "InferenceServices waiting in the work queue for a reconcile pass.",
)
LEADER = Gauge(
    "pagoda_operator_leader",
    "1 while this replica holds the leader Lease (or runs without leader election) and reconciles, else 0.",
)
RECONCILES_IN_PROGRESS = Gauge(
    "pagoda_operator_reconciles_in_progress",
    "Reconcile passes running now (at most --workers).",
)
ROLLOUTS_QUEUED = Gauge(
    "pagoda_operator_rollouts_queued",
    "InferenceServices whose pod template change of the operator's (an upgrade's) waits for the fleet's "
    "rollout budget (--max-concurrent-rollouts), as of the last pass that asked it.",
)
BUDGET_REPLICAS = Gauge(
    "pagoda_budget_replicas",
    "Each GPUBudget member's replicas: `demand` (what its autoscaler asks for, up to maxReplicas), "
    "`allocated` (what the budget gives it), `limit` (its ScaledObject's maxReplicaCount now), `holding` "
    "(pods holding GPUs), as of the last pass of one of the budget's members. The member is "
    "`member_namespace`/`member`: a scrape's own `namespace` and `service` labels name the operator's.",
    ["budget", "member_namespace", "member", "measure"],
)
PROFILES_QUEUED = Gauge(
    "pagoda_operator_profiles_queued",
    "InferenceServices whose new capacity profile Job waits for the fleet's profile budget "
    "(--max-concurrent-profiles), as of the last pass that asked it.",
)

# Results are pre-created so that a scrape shows every series at 0 from the start.
for _result in ("applied", "unchanged", "error"):
    RECONCILES.labels(result=_result)


class QueueGauges(Protocol):
    """What watch_queue reads of the work queue (kube/workqueue.py), which imports this module's
    metrics through the reconcile: a protocol, so that this module imports nothing of it."""

    def __len__(self) -> int: ...

    def in_progress(self) -> int: ...


def watch_queue(queue: QueueGauges) -> None:
    """Export the work queue's length and the passes in flight, read at scrape time."""
    QUEUE_DEPTH.set_function(lambda: len(queue))
    RECONCILES_IN_PROGRESS.set_function(queue.in_progress)


async def serve(host: str, port: int, healthy: Callable[[], bool]) -> web.AppRunner:
    """Start serving /healthz (200 while `healthy()`, else 503) and /metrics; returns the runner to stop."""

    async def healthz(_request: web.Request) -> web.Response:
        if healthy():
            return web.Response(text="ok\n")
        return web.Response(status=503, text="unhealthy\n")

    async def prometheus(_request: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(REGISTRY))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", prometheus)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("Started metrics endpoint host=%s port=%d", host, port)
    return runner
