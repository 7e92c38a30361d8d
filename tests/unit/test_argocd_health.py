"""The Argo CD health check (Lua) run by a real Lua 5.1 interpreter against sample InferenceServices.

Argo CD runs health checks with gopher-lua, a Lua 5.1 implementation; lupa's lua51 module embeds the
reference Lua 5.1, so 5.2+ features used by mistake fail here too. The samples and expected results use
Argo CD's own health_test.yaml format, so the folder can be contributed upstream as is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lupa.lua51 as lua51  # noqa: E402  (lupa, dev extra, embeds the reference Lua 5.1)
import pytest
import yaml

from tests.repo import REPO

CHECK_DIR = REPO / "argocd" / "resource_customizations" / "pagoda.dev" / "InferenceService"
HEALTH_LUA = CHECK_DIR / "health.lua"


def _to_lua(lua: Any, value: Any) -> Any:
    """Convert decoded YAML into Lua tables, as Argo CD hands the object to the script."""
    if isinstance(value, dict):
        return lua.table_from({k: _to_lua(lua, v) for k, v in value.items()})
    if isinstance(value, list):
        return lua.table_from([_to_lua(lua, v) for v in value])
    return value


def run_health_check(obj: dict[str, Any]) -> dict[str, str]:
    """Run health.lua with `obj` as its global, the way Argo CD does, and return {status, message}."""
    lua = lua51.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = _to_lua(lua, obj)
    result = lua.execute(HEALTH_LUA.read_text())
    assert result is not None, "health.lua returned nothing"
    return {"status": result["status"], "message": result["message"]}


CASES = yaml.safe_load((CHECK_DIR / "health_test.yaml").read_text())["tests"]


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_health_check_matches_expected(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((CHECK_DIR / case["inputPath"]).read_text())
    assert run_health_check(obj) == case["healthStatus"]


def test_every_sample_is_covered_by_a_case() -> None:
    samples = {p.name for p in (CHECK_DIR / "testdata").glob("*.yaml")}
    covered = {Path(c["inputPath"]).name for c in CASES}
    assert samples == covered


def test_statuses_are_the_three_argo_cd_knows_here() -> None:
    assert {c["healthStatus"]["status"] for c in CASES} == {"Healthy", "Progressing", "Degraded"}


def test_a_condition_without_observed_generation_is_trusted() -> None:
    obj = {
        "metadata": {"generation": 2},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "MinimumReplicasReady"}]},
    }
    assert run_health_check(obj) == {"status": "Healthy", "message": "MinimumReplicasReady"}


def test_argocd_cm_example_embeds_the_same_script() -> None:
    """examples/argocd/argocd-cm.yaml registers the check; it must carry this exact script."""
    cm = yaml.safe_load((REPO / "examples" / "argocd" / "argocd-cm.yaml").read_text())
    key = "resource.customizations.health.pagoda.dev_InferenceService"
    assert cm["data"][key].strip() == HEALTH_LUA.read_text().strip()
