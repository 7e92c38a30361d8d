"""The dashboards checked against Grafana's own schema, not only by our reading of it.

`dashboard-lint` (e2e/lab/tools/dashboard-lint, built by `make tools` into .pagoda-dev/bin) decodes each file
with the grafana-foundation-sdk, the Go types Grafana generates from the schemas it ships, with the default
panel and data-source plugins registered: strictly (an unknown field, a missing required field or a wrong type
is an error, in panel options, field config and Prometheus queries too), then Validate() (the schema's
constraints, e.g. gridPos.w <= 24). The cases below show it would catch each kind of mistake.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.repo import REPO

DASHBOARDS = sorted((REPO / "charts" / "pagoda" / "files" / "dashboards").glob("*.json"))


def dashboard_lint(*files: Path) -> subprocess.CompletedProcess[str]:
    binary = Path(os.environ.get("PAGODA_BIN") or REPO / ".pagoda-dev" / "bin") / "dashboard-lint"
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} not found: run `make tools`", pytrace=False)
    return subprocess.run([str(binary), *map(str, files)], capture_output=True, text=True, timeout=60)


def test_the_dashboards_match_grafanas_schema() -> None:
    result = dashboard_lint(*DASHBOARDS)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": OK\n") == len(DASHBOARDS) == 2, result.stdout


def _set(path: list[str | int], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(board: dict[str, Any]) -> None:
        node: Any = board
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value

    return edit


def _drop_target_datasource(board: dict[str, Any]) -> None:
    del board["panels"][4]["targets"][0]["datasource"]


# (mistake, edit of the operator dashboard, what dashboard-lint must say)
BROKEN = [
    (
        "unknown panel field",
        _set(["panels", 0, "colour"], "red"),
        "panels[0].Panel: unexpected field 'colour'",
    ),
    (
        "gridPos.h as a string",
        _set(["panels", 0, "gridPos", "h"], "4"),
        "panels[0].gridPos.h: json: cannot unmarshal string into Go value of type uint32",
    ),
    (
        "panel wider than the grid",
        _set(["panels", 4, "gridPos", "w"], 30),
        "panels[4].gridPos.w: must be <= 24",
    ),
    (
        "unknown panel type",
        _set(["panels", 4, "type"], "timeserie"),
        'panels[4].type: unknown panel type "timeserie"',
    ),
    (
        "misspelt panel option",
        _set(["panels", 4, "options", "legend", "dispalyMode"], "list"),
        "panels[4].options.legend.VizLegendOptions: unexpected field 'dispalyMode'",
    ),
    (
        "misspelt field config",
        _set(["panels", 4, "fieldConfig", "defaults", "unitt"], "s"),
        "panels[4].fieldConfig.defaults.FieldConfig: unexpected field 'unitt'",
    ),
    (
        "misspelt Prometheus query field",
        _set(["panels", 4, "targets", 0, "exprr"], "up"),
        "panels[4].targets[0].Dataquery: unexpected field 'exprr'",
    ),
    (
        "query without a data-source type",
        _drop_target_datasource,
        "panels[4].targets[0].datasource.type: missing or unknown",
    ),
    (
        "variable refresh as a string",
        _set(["templating", "list", 1, "refresh"], "onLoad"),
        "templating.list[1].refresh: json: cannot unmarshal string",
    ),
]


@pytest.mark.parametrize(("edit", "message"), [case[1:] for case in BROKEN], ids=[case[0] for case in BROKEN])
def test_dashboard_lint_names_each_mistake(
    edit: Callable[[dict[str, Any]], None], message: str, tmp_path: Path
) -> None:
    board = copy.deepcopy(json.loads((REPO / "charts/pagoda/files/dashboards/operator.json").read_text()))
    edit(board)
    broken = tmp_path / "operator.json"
    broken.write_text(json.dumps(board))
    result = dashboard_lint(broken)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{broken}: {message}" in result.stdout, result.stdout
