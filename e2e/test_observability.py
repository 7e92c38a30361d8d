"""Every dashboard panel, proved on real data: the Prometheus Operator's Prometheus (the stack's,
e2e/lab/prometheus_operator.py) scrapes a runtime pod on the real node (from the CPU runtime image, under load
through its Service) through the ServiceMonitor the operator writes for it, and the chart's operator pod
reconciling InferenceServices through the chart's ServiceMonitor; each panel's query (with the dashboard's
variables resolved through Prometheus, as Grafana does) must succeed and return data.

The chart's alert and recording rules reach Prometheus as users' do: the chart's PrometheusRule, loaded by the
Prometheus Operator; they must evaluate without errors. Cost: the stack's kube-state-metrics runs with the
chart's custom-resource-state config, where an InferenceService `ml/tiny` has a known spec.cost; the cost
panels must match the arithmetic on the token rate the load generator itself measured, within 5%.
The only panels that cannot get data here are the LoRA adapter panels (LORA_METRICS): the runtime here serves
the base model only, and the runtime tier (tests/runtime/test_rt_lora.py) checks the counters
they read, per adapter; the routing panels (the endpoint picker's metrics), which e2e/test_routing.py and
e2e/test_scale_from_zero.py check on the real picker; and the capacity panels (status.profile, which only a
capacity profile's run fills), which e2e/test_capacity_profile.py checks on a real profile.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from e2e.fixtures import chart_operator
from e2e.lab.chartenv import ChartOperator
from e2e.lab.cluster import OPERATOR_RELEASE, Cluster
from e2e.lab.observability import (
    OPERATOR_LABELS,
    RATE_INTERVAL,
    RUNTIME_LABELS,
    Load,
    PrometheusAt,
    dashboard,
    panel_queries,
    resolve_variables,
)
from e2e.lab.processes import wait_until
from e2e.lab.realpods import get_json, pods, service_url, wait_condition
from e2e.lab.samples import budget_member, gpu_budget, tiny_sample
from e2e.lab.stack import Stack

pytestmark = pytest.mark.e2e

# The cost rules' token-rate window (chart value prometheusRule.costRateWindow, 5m by default): one minute,
# so that the load has filled a whole window a minute after it started.
COST_WINDOW_SECONDS = 60
# spec.cost of the InferenceService that the runtime's series belong to (namespace ml, service tiny).
# A cheap API (0.06 per 1M tokens): break-even is then about 11,600 tokens/s, ten times what the tiny model
# makes here, so serving costs more than the API whatever the machine's speed (at 0.6 the break-even,
# 1,157 tokens/s, was within the measured 1,160-1,178 and the cost alert's premise failed).
GPU_HOUR_PRICE, API_PRICE, GPUS = 2.5, 0.06, 1
REPLICAS = 1  # examples/tiny-cpu.yaml's one replica
MAX_NUM_SEQS = 4  # fewer than the load's clients (6), so that requests queue
READY_TIMEOUT = 420.0  # a first pull of the 7 GB runtime image, then the engine's start on two cores


@pytest.fixture(scope="module")
def prometheus(stack: Stack) -> PrometheusAt:
    return PrometheusAt(stack.prometheus_url)


@pytest.fixture(scope="module")
def operator(cluster: Cluster) -> Iterator[ChartOperator]:
    """The chart's operator, re-checking every InferenceService every 2 s, so that its reconcile panels
    fill within a minute; with the chart's opt-in Secret existence check (rbac.secretExistenceCheck), so
    that a missing Secret is the reconcile error the error panel shows (SecretNotFound); with its
    ServiceMonitor (scraped every second) and its PrometheusRule, the cost rules over COST_WINDOW_SECONDS."""
    values = (
        "operator.extraArgs={--resync-seconds=2}",
        "rbac.secretExistenceCheck=true",
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.interval=1s",
        "prometheusRule.enabled=true",
        f"prometheusRule.costRateWindow={COST_WINDOW_SECONDS}s",
    )
    with chart_operator(cluster, values=values) as running:
        yield running


@pytest.fixture(scope="module")
def served(cluster: Cluster, operator: ChartOperator) -> Iterator[dict[str, Any]]:
    """InferenceService ml/tiny (examples/tiny-cpu.yaml, its pod on the real node) with a known spec.cost and
    at most MAX_NUM_SEQS sequences in a batch, so that the load queues; yields its Ready pod. Its namespace
    goes with the module: a replica left running holds 500m of the real node's 2 CPUs, which the later
    modules' replicas need (e2e/test_routing.py's second one stayed Pending, Insufficient cpu)."""
    namespace, name = RUNTIME_LABELS["namespace"], RUNTIME_LABELS["service"]
    cluster.kubectl("create", "namespace", namespace, check=False)
    service = tiny_sample(namespace, name, real_pods=True)
    service["spec"]["engine"]["maxNumSeqs"] = MAX_NUM_SEQS
    service["spec"]["cost"] = {"gpuHourPrice": GPU_HOUR_PRICE, "apiPricePerMillionTokens": API_PRICE}
    service["spec"]["monitoring"] = {"serviceMonitor": {"enabled": True, "interval": "1s"}}
    assert service["spec"]["resources"]["gpu"]["count"] == GPUS
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(service))
    wait_condition(cluster, namespace, name, "Ready", timeout=READY_TIMEOUT)
    (pod,) = pods(cluster, namespace, name)
    # The start-up panels read status.startup (through kube-state-metrics), written once the operator has
    # asked the Ready pod for its phases.
    wait_until(
        lambda: get_json(cluster, "-n", namespace, "inferenceservice", name)["status"].get("startup"),
        "status.startup of ml/tiny",
        timeout=120,
        interval=1,
    )
    try:
        yield pod
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def loaded_runtime(prometheus: PrometheusAt, cluster: Cluster, served: dict[str, Any]) -> Iterator[Load]:
    """The runtime pod scraped every second through its ServiceMonitor, under a steady stream of chat
    requests through its Service's ClusterIP."""
    namespace, name = RUNTIME_LABELS["namespace"], RUNTIME_LABELS["service"]
    wait_until(
        lambda: prometheus.query(
            f'up{{namespace="{namespace}", service="{name}", pod="{served["metadata"]["name"]}"}} == 1'
        ),
        f"Prometheus to scrape {namespace}/{name}'s pod through its ServiceMonitor",
        timeout=120,
        interval=1,
    )
    # Bounded by time only (Load's 1,200 s): its default count (20,000) ran out after about 7 minutes here,
    # and sooner on a faster machine, before the module's last test read the rates.
    load = Load(service_url(cluster, namespace, name), name, max_requests=1_000_000).start()
    try:
        # Enough traffic that every rate() over the rate interval sees it.
        wait_until(
            lambda: prometheus.query(
                f'sum(increase(vllm:request_success_total{{service="tiny"}}[{RATE_INTERVAL}])) > 20'
            ),
            "requests to show up in Prometheus",
            timeout=180,
            interval=1,
        )
        yield load
    finally:
        load.stop()


@pytest.fixture(scope="module")
def priced_service(prometheus: PrometheusAt, served: dict[str, Any]) -> None:
    """The stack's kube-state-metrics (the chart's custom-resource-state config; a ScrapeConfig names it)
    gives the price of ml/tiny and its Deployment's replicas; the chart's cost rules turn them into series."""
    del served
    wait_until(
        lambda: prometheus.query('pagoda:cost_per_million_tokens{namespace="ml", service="tiny"}'),
        "the price from kube-state-metrics and the cost rules in Prometheus",
        timeout=120,
        interval=1,
    )


@pytest.fixture(scope="module")
def reconciling_operator(
    prometheus: PrometheusAt, cluster: Cluster, operator: ChartOperator
) -> Iterator[None]:
    """The chart's operator reconciling a good and a broken InferenceService (missing Secret), scraped
    through the chart's ServiceMonitor; the good one is the member of a GPUBudget, so that the budget panels
    have a series."""
    namespace = f"obs-{int(time.time())}"
    cluster.kubectl("create", "namespace", namespace)
    sample = tiny_sample(namespace)
    broken = json.loads(json.dumps(sample))
    broken["metadata"]["name"] = "tiny-broken"
    broken["spec"]["model"]["credentialsSecret"] = "does-not-exist"
    objects = [gpu_budget(namespace, 2, namespace), budget_member(sample, namespace), broken]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    try:
        wait_until(
            lambda: (
                prometheus.query(
                    f'sum(rate(pagoda_operator_reconcile_errors_total{{service="pagoda-metrics"}}[{RATE_INTERVAL}]))'
                    " > 0"
                )
                and prometheus.query(
                    f'sum(increase(pagoda_operator_reconciles_total{{service="pagoda-metrics"}}[{RATE_INTERVAL}]))'
                    " > 3"
                )
            ),
            "the operator's reconciles and errors in Prometheus",
            timeout=120,
            interval=1,
        )
        wait_until(
            lambda: prometheus.query(
                f'pagoda_budget_replicas{{service="pagoda-metrics", budget="{namespace}", '
                'measure="allocated"} >= 1'
            ),
            f"the budget {namespace}'s allocation in Prometheus",
            timeout=120,
            interval=1,
        )
        yield
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        cluster.kubectl("delete", "gpubudget", namespace, "--wait=false", check=False)


# The LoRA panels' counters exist only on a runtime serving adapters (docs/lora.md#metrics).
LORA_METRICS = ("pagoda_lora_requests_total", "pagoda_lora_generation_tokens_total")
# The routing panels read the endpoint picker's metrics (spec.routing), which no picker serves here.
PICKER_METRICS = ("inference_extension_",)
# The capacity panels read status.profile and status.sizing.targetPerReplica (spec.slo), which only a
# capacity profile's run fills.
PROFILE_METRICS = ("pagoda_inferenceservice_status_profile_", "pagoda_inferenceservice_status_sizing_target_")
# The autoscaling panel reads the condition ScalingMetricsUnavailable, which only a service with
# spec.autoscaling has (none here): tests/unit/test_reconcile_scalingmetrics.py and
# tests/integration/test_operator_scaling.py check the condition, e2e/test_autoscaling.py on real KEDA.
AUTOSCALING_CONDITIONS = ('type="ScalingMetricsUnavailable"',)


def check_panels(
    prom: PrometheusAt, board: dict[str, Any], variables: dict[str, str]
) -> dict[tuple[str, str], list[dict[str, Any]]]:
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    empty = []
    for title, legend, expr in panel_queries(board, variables):
        result = prom.query(expr)  # raises on a PromQL error, naming the query
        if any(metric in expr for metric in LORA_METRICS):
            continue  # no adapter is served here: tests/runtime/test_rt_lora.py checks the counters
        if any(metric in expr for metric in PICKER_METRICS):
            continue  # no picker here: e2e/test_routing.py and test_scale_from_zero.py check these panels
        if any(metric in expr for metric in PROFILE_METRICS):
            continue  # no profile ran here: e2e/test_capacity_profile.py checks these panels
        if any(condition in expr for condition in AUTOSCALING_CONDITIONS):
            continue  # no autoscaled service here
        if not result:
            empty.append(f"{title} [{legend}]: {expr}")
        results[(title, legend)] = result
    assert not empty, "panels without data:\n" + "\n".join(empty)
    return results


def value(result: list[dict[str, Any]]) -> float:
    """The largest sample of an instant-query result (NaN counts as 0)."""
    values = [float(r["value"][1]) for r in result]
    return max((v for v in values if not math.isnan(v)), default=0.0)


def test_inferenceservice_dashboard_panels_have_data_under_load(
    prometheus: PrometheusAt, loaded_runtime: Load, priced_service: None
) -> None:
    board = dashboard("inferenceservice")
    variables = resolve_variables(prometheus, board, choose={"namespace": "ml", "service": "tiny"})
    results = check_panels(prometheus, board, variables)
    # Under load the traffic panels show traffic, not only zeros.
    for key in [
        ("Request rate", "{{finished_reason}}"),
        ("Tokens per second", "generated"),
        ("Tokens per second", "prompt"),
        ("Time to first token", "p50"),
        ("Inter-token latency", "p99"),
        ("KV-cache usage", "{{pod}}"),
        ("Ready replicas", "ready"),
        ("Replicas: desired vs ready", "scraped pods"),
        ("Cost per 1M generated tokens", "serving ({{currency}})"),
        ("Cost per 1M generated tokens", "API ({{currency}})"),
        ("Break-even utilization", "of break-even"),
    ]:
        assert value(results[key]) > 0, f"{key} is 0 under load"
    assert loaded_runtime.completed > 0 and not loaded_runtime.failures, loaded_runtime.failures[:5]


def test_queue_running_and_prefix_cache_panels_saw_the_load(
    prometheus: PrometheusAt, loaded_runtime: Load
) -> None:
    """Gauges are sampled: look at the last minute rather than one instant."""
    sel = 'namespace="ml", service="tiny"'
    assert value(prometheus.query(f"max_over_time(sum(pagoda_running_requests{{{sel}}})[1m:1s])")) > 0
    assert value(prometheus.query(f"max_over_time(sum(pagoda_queue_depth{{{sel}}})[1m:1s])")) > 0
    hits = prometheus.query(f"sum(increase(vllm:prefix_cache_hits_total{{{sel}}}[1m]))")
    assert value(hits) > 0, "the shared system prompt should hit the prefix cache"


def test_operator_dashboard_panels_have_data(
    prometheus: PrometheusAt, reconciling_operator: None, operator: ChartOperator
) -> None:
    board = dashboard("operator")
    chosen = {"namespace": operator.namespace, "service": OPERATOR_LABELS["service"]}
    results = check_panels(prometheus, board, resolve_variables(prometheus, board, choose=chosen))
    assert value(results[("Reconciles", "{{result}}")]) > 0
    assert value(results[("Reconcile errors", "{{reason}}")]) > 0
    errors = prometheus.query(
        "sum by (reason) (pagoda_operator_reconcile_errors_total"
        f'{{namespace="{operator.namespace}", service="pagoda-metrics"}})'
    )
    assert "SecretNotFound" in {r["metric"]["reason"] for r in errors}
    assert value(results[("Reconcile latency", "p99")]) > 0
    assert value(results[("Operator up", "up")]) == 1
    budget_series = "{{budget}}: {{member_namespace}}/{{member}} "
    assert value(results[("GPU budget: demand vs allocated", budget_series + "allocated")]) >= 1
    assert value(results[("GPU budget: limit vs holding", budget_series + "limit")]) >= 1


def test_chart_alert_rules_evaluate_on_real_data(
    prometheus: PrometheusAt, loaded_runtime: Load, operator: ChartOperator
) -> None:
    """The chart's PrometheusRule, as the Prometheus Operator loaded it (a rule file named after the rule's
    namespace and name), evaluates without errors."""
    rule_file = f"{operator.namespace}-{OPERATOR_RELEASE}-"

    def evaluated() -> list[dict[str, Any]]:
        groups: list[dict[str, Any]] = prometheus.api("rules")["groups"]
        rules = [rule for group in groups if rule_file in group["file"] for rule in group["rules"]]
        return (
            rules if rules and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules) else []
        )

    rules = wait_until(evaluated, f"the chart's rules ({rule_file}*) to be evaluated", timeout=60)
    assert {r["name"] for r in rules} >= {"PagodaQueueBackingUp", "PagodaTTFTHigh", "PagodaNoReadyReplicas"}
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
    # A healthy, ready runtime under light load fires none of the runtime alerts' conditions.
    firing = {
        a["labels"]["alertname"]
        for a in prometheus.api("alerts")["alerts"]
        if a["labels"].get("namespace") == RUNTIME_LABELS["namespace"]
    }
    assert not firing & {"PagodaNoReadyReplicas", "PagodaKVCacheNearlyFull"}


def test_cost_panels_match_the_arithmetic_on_the_measured_token_rate(
    prometheus: PrometheusAt, loaded_runtime: Load, priced_service: None
) -> None:
    """The cost panels' values at one instant against the arithmetic on the same window of the load: the
    price and GPU count from spec.cost (through kube-state-metrics), one replica (the one runtime), and the
    generated tokens per second counted by the load generator from each response's usage."""
    load = loaded_runtime
    began = min(r.started for r in load.records)
    wait_until(
        lambda: time.monotonic() - began > COST_WINDOW_SECONDS + 10,
        "a whole cost window under load",
        timeout=COST_WINDOW_SECONDS + 30,
    )
    offset = time.time() - time.monotonic()  # monotonic -> Unix time, for Prometheus
    at = time.monotonic() - 2  # an instant the rules have surely been evaluated at
    panels = {
        (title, legend): expr
        for title, legend, expr in panel_queries(
            dashboard("inferenceservice"), {"namespace": "ml", "service": "tiny"}
        )
    }

    def panel(title: str, legend: str) -> float:
        [result] = prometheus.query(panels[(title, legend)], at=at + offset)
        return float(result["value"][1])

    cost_per_million = panel("Cost per 1M generated tokens", "serving ({{currency}})")
    api = panel("Cost per 1M generated tokens", "API ({{currency}})")
    utilization = panel("Break-even utilization", "of break-even")
    generated = panel("Throughput vs break-even", "generated tokens/s")
    break_even = panel("Throughput vs break-even", "break-even tokens/s")
    # The rules' last evaluation before `at` (1 s interval): their token-rate window ends there.
    [evaluated] = prometheus.query(
        'timestamp(pagoda:cost_per_million_tokens{namespace="ml", service="tiny"})', at=at + offset
    )
    end = float(evaluated["value"][1]) - offset
    wait_until(
        lambda: load.oldest_open() > end, "the requests open at the window's end to finish", timeout=60
    )
    tokens_per_second = load.tokens_between(end - COST_WINDOW_SECONDS, end) / COST_WINDOW_SECONDS
    cost_per_second = GPU_HOUR_PRICE * GPUS * REPLICAS / 3600
    expected = {
        "generated tokens/s": tokens_per_second,
        "cost per 1M tokens": cost_per_second / tokens_per_second * 1e6,
        "break-even tokens/s": cost_per_second / API_PRICE * 1e6,
        "break-even utilization": tokens_per_second / (cost_per_second / API_PRICE * 1e6),
    }
    got = {
        "generated tokens/s": generated,
        "cost per 1M tokens": cost_per_million,
        "break-even tokens/s": break_even,
        "break-even utilization": utilization,
    }
    print(f"\nMeasured {tokens_per_second:.2f} generated tokens/s over {COST_WINDOW_SECONDS}s")
    print(f"Arithmetic {expected}\nPanels     {got}")
    assert api == API_PRICE
    for name, value in expected.items():
        assert abs(got[name] / value - 1) < 0.05, f"{name}: panel {got[name]:.4f}, arithmetic {value:.4f}"

    # 2.5 per GPU hour for a tiny CPU model: far dearer than the API, so the alert is on its way. Its
    # state is read now, not at the panels' time: a rule evaluation that finds no series (a scrape that came
    # late on a busy machine) resets it to inactive until the next, so it is waited for (seen once in CI).
    def cost_alert_pending() -> bool:
        return any(
            a["labels"]["alertname"] == "PagodaServingCostsMoreThanApi"
            and (a["labels"].get("namespace"), a["labels"].get("service")) == ("ml", "tiny")
            and a["state"] == "pending"
            for a in prometheus.api("alerts")["alerts"]
        )

    wait_until(
        cost_alert_pending, "PagodaServingCostsMoreThanApi pending for ml/tiny", timeout=60, interval=1
    )
