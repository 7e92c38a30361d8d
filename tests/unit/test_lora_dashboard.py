"""The InferenceService dashboard's LoRA panels, evaluated by Prometheus' own `promtool test rules` on series
shaped like the runtime's (`pagoda_lora_*_total{model_name, adapter}` plus the scrape's namespace, service
and pod): per adapter, summed over the replicas, scoped to the selected service. The e2e observability
test runs a runtime without adapters, so this is where the queries meet data."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.lab.observability import panel_queries
from tests.repo import REPO

BOARD = REPO / "charts" / "pagoda" / "files" / "dashboards" / "inferenceservice.json"
PANELS = {"LoRA adapter requests": "pagoda_lora_requests_total"}
PANELS["LoRA adapter tokens per second"] = "pagoda_lora_generation_tokens_total"


def lora_queries() -> dict[str, str]:
    board: dict[str, Any] = json.loads(BOARD.read_text())
    variables = {"namespace": "ml", "service": "tiny"}
    return {title: expr for title, _, expr in panel_queries(board, variables) if title in PANELS}


def test_the_panels_read_the_lora_counters_by_adapter() -> None:
    queries = lora_queries()
    assert set(queries) == set(PANELS)
    for title, metric in PANELS.items():
        assert queries[title].startswith(f"sum by (adapter) (rate({metric}{{"), queries[title]


def test_promtool_evaluates_the_panels_per_adapter_over_replicas(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: `make test` installs Debian's prometheus package"
    queries = lora_queries()
    rules = [
        {"record": f"pagoda:dashboard:lora{i}", "expr": queries[title]} for i, title in enumerate(PANELS)
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": [{"name": "lora", "rules": rules}]}))

    def series(metric: str, pod: str, adapter: str, service: str = "tiny") -> str:
        labels = f'namespace="ml", service="{service}", pod="{pod}", model_name="tiny", adapter="{adapter}"'
        return f"{metric}{{{labels}}}"

    # Per second: sql 2 requests on each of two pods (4 in all), chat 1 on one pod; another service's adapter
    # is not shown. Tokens: 30 per request.
    requests, tokens = PANELS["LoRA adapter requests"], PANELS["LoRA adapter tokens per second"]
    inputs = [
        (requests, "a", "sql", "tiny", 2),
        (requests, "b", "sql", "tiny", 2),
        (requests, "a", "chat", "tiny", 1),
        (requests, "c", "sql", "other", 5),
        (tokens, "a", "sql", "tiny", 60),
        (tokens, "b", "sql", "tiny", 60),
        (tokens, "a", "chat", "tiny", 30),
    ]
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1s",
        "tests": [
            {
                "interval": "1s",
                "input_series": [
                    {"series": series(metric, pod, adapter, service), "values": f"0+{step}x120"}
                    for metric, pod, adapter, service, step in inputs
                ],
                "promql_expr_test": [
                    {
                        "expr": f"pagoda:dashboard:lora{i}",
                        "eval_time": "100s",
                        "exp_samples": [
                            {"labels": f'pagoda:dashboard:lora{i}{{adapter="chat"}}', "value": chat},
                            {"labels": f'pagoda:dashboard:lora{i}{{adapter="sql"}}', "value": sql},
                        ],
                    }
                    for i, (chat, sql) in enumerate([(1, 4), (30, 120)])
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        pytest.fail(result.stdout + result.stderr)
