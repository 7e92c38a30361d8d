"""The ScaledObject's replica queries, evaluated by Prometheus' own engine (`promtool test rules`'s PromQL
cases) on the three states KEDA must tell apart (issue #40 §7):

- pods scraped: the load, summed over the pods;
- no pod at all (a routed service at zero): 0, no load, so KEDA neither fails nor falls back (an empty answer
  there started a replica of an idle service about once a minute, e2e/test_scale_from_zero.py);
- pods whose scrapes fail (`up` 0, no series): nothing, which the trigger's `ignoreNullValues: "false"`
  makes a failure, and KEDA's fallback then holds the replicas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from pagoda.operator.resources.scaledobject import in_flight_query, kv_cache_query, queue_depth_query
from tests.unit.test_alerts import run_promtool

NS, SERVICE = "ml", "chat"
SCRAPED = [
    ('up{namespace="ml", service="chat", pod="chat-a"}', "1x5"),
    ('up{namespace="ml", service="chat", pod="chat-b"}', "1x5"),
    ('pagoda_running_requests{namespace="ml", service="chat", pod="chat-a"}', "2x5"),
    ('pagoda_running_requests{namespace="ml", service="chat", pod="chat-b"}', "3x5"),
    ('pagoda_queue_depth{namespace="ml", service="chat", pod="chat-a"}', "1x5"),
    ('pagoda_queue_depth{namespace="ml", service="chat", pod="chat-b"}', "0x5"),
    ('pagoda_kv_cache_usage_ratio{namespace="ml", service="chat", pod="chat-a"}', "0.25x5"),
    ('pagoda_kv_cache_usage_ratio{namespace="ml", service="chat", pod="chat-b"}', "0.5x5"),
]
# Another service's pods in the namespace, and this one's under another namespace: never this service's.
NEIGHBOURS = [
    ('up{namespace="ml", service="other", pod="other-a"}', "1x5"),
    ('pagoda_running_requests{namespace="ml", service="other", pod="other-a"}', "7x5"),
    ('up{namespace="team-b", service="chat", pod="chat-x"}', "1x5"),
    ('pagoda_queue_depth{namespace="team-b", service="chat", pod="chat-x"}', "9x5"),
]
FAILING = [
    ('up{namespace="ml", service="chat", pod="chat-a"}', "0x5"),
]
ZERO = [{"labels": '{namespace="ml", service="chat"}', "value": 0}]


def case(series: list[tuple[str, str]], expected: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    return {
        "interval": "1m",
        "input_series": [{"series": name, "values": values} for name, values in series],
        "promql_expr_test": [
            {"expr": expr, "eval_time": "2m", "exp_samples": samples} for expr, samples in expected.items()
        ],
    }


QUERIES = {
    "in-flight": in_flight_query(SERVICE, NS),
    "queue-depth": queue_depth_query(SERVICE, NS),
    "kv-cache": kv_cache_query(SERVICE, NS),
}


@pytest.mark.parametrize(
    ("series", "answers"),
    [
        (SCRAPED + NEIGHBOURS, {"in-flight": 6, "queue-depth": 1, "kv-cache": 0.5}),
        (NEIGHBOURS, {"in-flight": ZERO, "queue-depth": ZERO, "kv-cache": ZERO}),
        (FAILING + NEIGHBOURS, {"in-flight": [], "queue-depth": [], "kv-cache": []}),
    ],
    ids=["pods-scraped", "no-pod", "scrapes-failing"],
)
def test_the_replica_queries_tell_no_pod_from_a_failing_scrape(
    tmp_path: Path, series: list[tuple[str, str]], answers: dict[str, Any]
) -> None:
    expected = {
        QUERIES[name]: answer if isinstance(answer, list) else [{"labels": "{}", "value": answer}]
        for name, answer in answers.items()
    }
    (tmp_path / "none.yaml").write_text(yaml.safe_dump({"groups": []}))
    tests = {"rule_files": ["none.yaml"], "evaluation_interval": "1m", "tests": [case(series, expected)]}
    (tmp_path / "queries_test.yaml").write_text(yaml.safe_dump(tests))
    run_promtool(tmp_path, "test", "rules", "queries_test.yaml")
