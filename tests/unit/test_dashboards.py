"""The Grafana dashboards: structure, variables, and every panel query parsed by Prometheus' own parser.

Parsing needs no data: every query, with the variables substituted by the same code as the e2e test's
(e2e/lab/observability.py: resolve_variables, panel_queries), is wrapped in a recording rule and checked with
`promtool check rules`, so a typo fails here before any query runs. Whether each query returns data from a
real runtime and operator is proved in e2e/test_observability.py; the dashboards' JSON is checked against
Grafana's schema in test_dashboard_schema.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from metric_contract import LORA_METRICS, OPERATOR_METRICS, PICKER_METRICS, RUNTIME_METRICS

from e2e.lab.observability import PromQL, panel_queries, resolve_variables
from tests.repo import REPO

DASHBOARDS = sorted((REPO / "charts" / "pagoda" / "files" / "dashboards").glob("*.json"))

# Metrics each dashboard may use: the stable contract names (metric_contract), vLLM's, and
# kube-state-metrics' (named as such: only those panels need kube-state-metrics).
KUBE_STATE_METRICS = {"kube_deployment_spec_replicas", "kube_deployment_status_replicas_ready"}
CHART = REPO / "charts" / "pagoda"


def custom_resource_metrics() -> set[str]:
    """What kube-state-metrics exports from InferenceServices with the chart's custom-resource-state file."""
    config = yaml.safe_load((CHART / "files" / "kube-state-metrics" / "inferenceservice.yaml").read_text())
    return {
        f"{resource['metricNamePrefix']}_{metric['name']}"
        for resource in config["spec"]["resources"]
        for metric in resource["metrics"]
    }


def recorded_series() -> set[str]:
    """The series the chart's PrometheusRule records (the cost panels read them)."""
    from tests.unit.test_alerts import records, rule_spec

    return {rule["record"] for rule in records(rule_spec())}


def load(path: Path) -> dict[str, Any]:
    board: dict[str, Any] = json.loads(path.read_text())
    return board


def targets(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel."""
    return [(panel["title"], target["expr"]) for panel in board["panels"] for target in panel["targets"]]


def metric_names(expr: str) -> set[str]:
    """Metric names in a query (identifiers followed by a selector or range), ignoring functions."""
    names = set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{", expr))
    return {n for n in names if n not in {"by", "without", "on", "ignoring"}}


@pytest.fixture(params=DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def board(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


def test_the_two_dashboards_exist() -> None:
    assert {p.stem for p in DASHBOARDS} == {"inferenceservice", "operator"}
    uids = [load(p)["uid"] for p in DASHBOARDS]
    assert len(set(uids)) == len(uids)


def test_variables(board: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "service"}
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["namespace"]["definition"].startswith("label_values(")
    assert '{namespace="$namespace"}' in variables["service"]["definition"]


def test_panels_query_prometheus_through_the_variable(board: dict[str, Any]) -> None:
    assert board["panels"]
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        assert panel.get("description"), f"{panel['title']}: no description"


def test_every_query_is_scoped_to_the_selected_service(board: dict[str, Any]) -> None:
    for title, expr in targets(board):
        for selector in re.findall(r"\{([^}]*)\}", expr):
            if (
                "deployment=" in selector
            ):  # kube-state-metrics names the Deployment, which has the service's name
                assert 'namespace="$namespace", deployment="$service"' in selector, title
            elif "inference_extension_" in expr:  # the endpoint picker's Service is <name>-epp
                assert 'namespace="$namespace", service="$service-epp"' in selector, title
            else:
                assert 'namespace="$namespace", service="$service"' in selector, title


def test_panels_do_not_overlap(board: dict[str, Any]) -> None:
    taken: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_inferenceservice_dashboard_covers_the_issue() -> None:
    board = load(REPO / "charts/pagoda/files/dashboards/inferenceservice.json")
    text = json.dumps(board)
    for metric in (
        "vllm:request_success_total",
        "pagoda_queue_depth",
        "pagoda_running_requests",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:generation_tokens_total",
        "pagoda_kv_cache_usage_ratio",
        "vllm:prefix_cache_hits_total",
        "kube_deployment_spec_replicas",
        "kube_deployment_status_replicas_ready",
        "pagoda:cost_per_million_tokens",
        "pagoda_inferenceservice_spec_cost_api_price_per_million_tokens",
        "pagoda:break_even_utilization",
        "pagoda:break_even_tokens_per_second",
    ):
        assert metric in text, metric
    titles = {p["title"] for p in board["panels"]}
    assert {"Request rate", "Errors", "Scaling events", "Replicas: desired vs ready"} <= titles
    assert {"Cost per 1M generated tokens", "Break-even utilization"} <= titles


def test_metric_names_are_known() -> None:
    """Runtime, vLLM and kube-state-metrics names, the chart's recorded series and what kube-state-metrics
    exports with the chart's custom-resource-state config: nothing the dashboard cannot get."""
    allowed_runtime = RUNTIME_METRICS | LORA_METRICS | PICKER_METRICS | KUBE_STATE_METRICS | {"up"}
    allowed_runtime |= recorded_series()
    allowed_runtime |= custom_resource_metrics()
    for path in DASHBOARDS:
        for title, expr in targets(load(path)):
            for name in metric_names(expr):
                if path.stem == "operator":
                    assert name in OPERATOR_METRICS | {
                        "up",
                        "process_resident_memory_bytes",
                        "process_cpu_seconds_total",
                    }, (title, name)
                else:
                    assert name in allowed_runtime or name.startswith("vllm:"), (title, name)


def test_operator_metric_names_match_the_operator() -> None:
    from prometheus_client import REGISTRY

    import pagoda.operator.metrics  # noqa: F401  (registers the operator's metrics)

    exposed = {sample.name for family in REGISTRY.collect() for sample in family.samples}
    exposed |= {
        f"{family.name}_total" for family in REGISTRY.collect() if family.type == "counter"
    }  # a counter's family name drops _total
    # A labelled gauge has no sample before its first series (pagoda_budget_replicas: a budget's member).
    exposed |= {family.name for family in REGISTRY.collect() if family.type == "gauge"}
    for name in OPERATOR_METRICS:
        assert name in exposed, name


class SampleLabels(PromQL):
    """Stands in for Prometheus when resolve_variables() asks for a variable's values: it answers one sample
    value and keeps the variable's selector (PromQL too, the part of Grafana's label_values() that is)."""

    def __init__(self) -> None:
        self.selectors: list[str] = []

    def label_values(self, label: str, match: str) -> list[str]:
        self.selectors.append(match)
        return [f"sample-{label}"]


def queries_as_sent(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(what, query) for each variable's selector and each panel's query, variables substituted as in e2e."""
    labels = SampleLabels()
    variables = resolve_variables(labels, board)
    out = [(f"variable selector {selector}", selector) for selector in labels.selectors]
    return out + [(f"panel {title!r}", expr) for title, _, expr in panel_queries(board, variables)]


def promtool_check_queries(queries: list[tuple[str, str]], workdir: Path) -> tuple[int, str]:
    """`promtool check rules` on one recording rule per query: (exit status, output naming each rule)."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make test` installs Debian's prometheus package"
    rules = [{"record": f"pagoda:dashboard:query{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]
    (workdir / "queries.yaml").write_text(
        yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]})
    )
    result = subprocess.run(
        [promtool, "check", "rules", "queries.yaml"], cwd=workdir, capture_output=True, text=True, timeout=60
    )
    legend = "\n".join(f"rule {i + 1}: {what}" for i, (what, _) in enumerate(queries))
    return result.returncode, f"{result.stdout}{result.stderr}\n{legend}"


def test_every_query_parses_with_promtool(board: dict[str, Any], tmp_path: Path) -> None:
    queries = queries_as_sent(board)
    assert len(queries) == len(targets(board)) + 2  # the namespace and service variables
    returncode, output = promtool_check_queries(queries, tmp_path)
    assert returncode == 0, output
    assert f"SUCCESS: {len(queries)} rules found" in output


def test_promtool_rejects_a_typo(tmp_path: Path) -> None:
    """The check above would catch a typo: one query with a parenthesis left open fails, named by promtool."""
    queries = queries_as_sent(load(DASHBOARDS[0]))
    what, expr = queries[-1]
    assert expr.endswith(")"), expr
    queries[-1] = (what, expr.removesuffix(")"))
    returncode, output = promtool_check_queries(queries, tmp_path)
    assert returncode == 1, output
    assert f'rule {len(queries)}, "pagoda:dashboard:query{len(queries) - 1}"' in output, output
    assert "parse error: unclosed left parenthesis" in output, output
