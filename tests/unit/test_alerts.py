"""The chart's PrometheusRule, rendered by Helm and unit-tested by Prometheus' own `promtool test rules`.

promtool comes with Debian's `prometheus` package (installed by `make`); the cases are in
charts/pagoda/tests/alerts_test.yaml (series in, alerts with labels and annotations out).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_chart import CHART, REPO, find, render

REQUIRED_ALERTS = {
    "PagodaQueueBackingUp",
    "PagodaKVCacheNearlyFull",
    "PagodaTTFTHigh",
    "PagodaNoReadyReplicas",
    "PagodaOperatorReconcileErrors",
    "PagodaServingCostsMoreThanApi",
}
# The cost recording rules the dashboard's cost panels and the alert read (docs/observability.md#cost).
REQUIRED_RECORDS = {
    "pagoda:serving_cost_per_hour",
    "pagoda:generated_tokens_per_second",
    "pagoda:cost_per_million_tokens",
    "pagoda:break_even_tokens_per_second",
    "pagoda:break_even_utilization",
}


def promtool() -> str:
    found = shutil.which("promtool")
    if not found:
        pytest.fail("promtool not found: `make test` installs Debian's prometheus package", pytrace=False)
    return found


def run_promtool(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`promtool ARGS` in `folder`; fails with its output unless it succeeds."""
    result = subprocess.run([promtool(), *args], cwd=folder, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def rule_spec(*args: str) -> dict[str, Any]:
    (rule,) = find(render("--set", "prometheusRule.enabled=true", *args), "PrometheusRule")
    spec: dict[str, Any] = rule["spec"]
    return spec


def rules(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rule: alerts and recording rules."""
    return [rule for group in spec["groups"] for rule in group["rules"]]


def alerts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in rules(spec) if "alert" in rule]


def records(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for rule in rules(spec) if "record" in rule]


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rules")
    (folder / "rules.yaml").write_text(yaml.safe_dump(rule_spec()))
    shutil.copy(CHART / "tests" / "alerts_test.yaml", folder / "alerts_test.yaml")
    return folder


def test_promtool_checks_the_rules(rules_dir: Path) -> None:
    result = run_promtool(rules_dir, "check", "rules", "rules.yaml")
    assert f"SUCCESS: {len(rules(rule_spec()))} rules found" in result.stdout


def test_promtool_unit_tests_pass(rules_dir: Path) -> None:
    result = run_promtool(rules_dir, "test", "rules", "alerts_test.yaml")
    assert "SUCCESS" in result.stdout


def test_every_alert_is_unit_tested() -> None:
    cases = yaml.safe_load((CHART / "tests" / "alerts_test.yaml").read_text())["tests"]
    firing = {
        check["alertname"] for case in cases for check in case["alert_rule_test"] if check.get("exp_alerts")
    }
    assert firing == {rule["alert"] for rule in alerts(rule_spec())}


def test_every_recording_rule_is_unit_tested() -> None:
    """Each recorded series is checked with values (promql_expr_test), except the plain token rate."""
    cases = yaml.safe_load((CHART / "tests" / "alerts_test.yaml").read_text())["tests"]
    checked = {check["expr"] for case in cases for check in case.get("promql_expr_test", [])}
    recorded = {rule["record"] for rule in records(rule_spec())}
    assert recorded == REQUIRED_RECORDS
    assert recorded - checked == {"pagoda:generated_tokens_per_second"}


def test_cost_rules_take_their_window_and_for_from_values() -> None:
    spec = rule_spec("--set", "prometheusRule.costRateWindow=1m", "--set", "prometheusRule.costFor=2h")
    by_name = {rule.get("record") or rule["alert"]: rule for rule in rules(spec)}
    assert "[1m]" in by_name["pagoda:generated_tokens_per_second"]["expr"]
    assert by_name["PagodaServingCostsMoreThanApi"]["for"] == "2h"


def test_required_alerts_exist_with_severity_and_runbook() -> None:
    found = alerts(rule_spec())
    assert REQUIRED_ALERTS <= {rule["alert"] for rule in found}
    for rule in found:
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def _anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    heads = re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", head).strip().lower().replace(" ", "-") for head in heads}


def test_runbook_urls_point_at_sections_of_docs_alerts_md() -> None:
    anchors = _anchors((REPO / "docs" / "alerts.md").read_text())
    base = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]
    for rule in alerts(rule_spec()):
        url = rule["annotations"]["runbook_url"]
        page, _, anchor = url.partition("#")
        assert page == base and page.endswith("docs/alerts.md"), url
        assert anchor == rule["alert"].lower() and anchor in anchors, (
            f"{url}: no such section in docs/alerts.md"
        )


def test_thresholds_come_from_values() -> None:
    spec = rule_spec(
        "--set-json",
        "prometheusRule.kvCacheUsageRatio=0.8",  # --set would pass a float as a string
        "--set",
        "prometheusRule.ttftP99Seconds=5",
        "--set",
        "prometheusRule.queueDepthPerReplica=7",
        "--set",
        "prometheusRule.for=3m",
        "--set",
        "prometheusRule.runbookBaseUrl=https://runbooks.example.com/pagoda/",
    )
    by_name = {rule["alert"]: rule for rule in alerts(spec)}
    assert by_name["PagodaKVCacheNearlyFull"]["expr"].endswith("> 0.8")
    assert by_name["PagodaTTFTHigh"]["expr"].endswith("> 5")
    assert by_name["PagodaQueueBackingUp"]["expr"].endswith("> 7")
    assert by_name["PagodaQueueBackingUp"]["for"] == "3m"
    assert by_name["PagodaTTFTHigh"]["annotations"]["runbook_url"] == (
        "https://runbooks.example.com/pagoda#pagodattfthigh"
    )


def test_operator_down_targets_the_charts_metrics_service() -> None:
    by_name = {rule["alert"]: rule for rule in alerts(rule_spec())}
    expr = by_name["PagodaOperatorDown"]["expr"]
    assert 'namespace="pagoda-system"' in expr and 'service="pagoda-metrics"' in expr
    (service,) = find(render(), "Service")
    assert service["metadata"]["name"] == "pagoda-metrics"
