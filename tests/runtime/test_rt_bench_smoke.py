"""Tier 3: a smoke run of each benchmark that starts engines of its own (runtime_vs_vllm.py,
engine_processes.py, bench_lora.py) or a cluster (bench_routing.py, bench_slo_ramp.py, bench_budget.py), so
that none can stop working unseen: each runs as a subprocess with `--smoke-url` against the tier's shared
runtime (and `--smoke-pid`, its process tree), the smallest sizes, through the same measuring, statistics and
report code as the full run, in seconds. Every side is that one server, so the numbers are only checked to be
measured (positive), never compared; what only servers of the benchmark's own can show (start-up, greedy
equality across sides, the cluster's KV cache sizing, replicas, GPUs) must be reported as not measured, not
filled in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rt_harness import RuntimeProcess

from tests.repo import REPO

pytestmark = pytest.mark.runtime

BENCHMARKS = REPO / "benchmarks"


def smoke(benchmark: str, server: RuntimeProcess, out: Path, out_flag: str = "--json") -> dict[str, Any]:
    """Runs benchmarks/`benchmark` against `server`; its JSON report, after checking it exited 0 and said it
    was a smoke run."""
    assert server.proc is not None
    argv = [sys.executable, str(BENCHMARKS / benchmark), "--smoke-url", server.url]
    argv += ["--smoke-pid", str(server.proc.pid), out_flag, str(out)]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    print(proc.stdout)  # the report, shown when a test fails
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert f"SMOKE RUN against {server.url}" in proc.stdout, proc.stdout[-4000:]
    report: dict[str, Any] = json.loads(out.read_text())
    assert report["smoke"]["url"] == server.url and report["smoke"]["pid"] == server.proc.pid
    return report


def positive(values: dict[str, float]) -> bool:
    return bool(values) and all(v > 0 for v in values.values())


def test_runtime_vs_vllm(server: RuntimeProcess, tmp_path: Path) -> None:
    report = smoke("runtime_vs_vllm.py", server, tmp_path / "bench-runtime.json")
    sides = {"pagoda", "vllm"}
    assert set(report["throughput_tok_s"]) == sides and positive(report["throughput_tok_s"])
    assert positive(report["ttft_p50_ms"]) and positive(report["ttft_p99_ms"])
    assert set(report["prefix_ttft_p50_ms"]) == {"pagoda", "pagoda-nocache"}
    assert positive(report["prefix_ttft_p50_ms"])
    assert [len(rounds) for rounds in report["throughput_rounds_tok_s"].values()] == [1, 1]
    assert positive(report["ratios"])
    # The given server was running already: no start-up time, and the report says so.
    assert report["startup_s"] == {} and "startup_s" in report["smoke"]["not_measured"]


def test_engine_processes(server: RuntimeProcess, tmp_path: Path) -> None:
    report = smoke("engine_processes.py", server, tmp_path / "bench-engine.json")
    kinds = [kind for kind in report if kind != "smoke"]
    assert len(kinds) == 3
    for kind in kinds:
        [measured] = report[kind]
        assert set(measured) == {"tokens_per_s", "cores_under_load", "processes"}, measured
        assert measured["tokens_per_s"] > 0 and measured["cores_under_load"] > 0
        assert measured["processes"] >= 2  # the runtime (API server) and vLLM's EngineCore
    assert set(report["smoke"]["not_measured"]) == {"startup_s", "startup_cpu_s"}


def test_bench_lora(server: RuntimeProcess, tmp_path: Path) -> None:
    """The shared runtime serves no adapter: its base model is the one name on both sides."""
    report = smoke("bench_lora.py", server, tmp_path / "bench-lora.json")
    assert report["names"] == ["tiny"] and report["adapters"] == 1
    for side in ("lora", "merged"):
        measured = report[side]
        for key in ("requests_per_s", "tokens_per_s", "ttft_p50_ms", "ttft_p50_sequential_ms"):
            assert measured[key] > 0, (side, key, measured)
        assert measured["rss_mib"] > 0 and measured["uss_mib"] > 0
        assert len(measured["tokens_per_s_rounds"]) == 1
    assert positive(report["ratios"]) and set(report["ratios"]) >= {"rss", "throughput", "ttft_p50"}
    assert "greedy_same" not in report and "startup_s" not in report
    assert {"greedy_same", "startup_s"} <= set(report["smoke"]["not_measured"])


def test_bench_routing_load(server: RuntimeProcess, tmp_path: Path) -> None:
    report = smoke("bench_routing.py", server, tmp_path / "bench-routing.json", out_flag="--out")
    rows = report["rows"]
    assert {row["mode"] for row in rows} == {"picker", "round-robin"}
    loads = {row["load"] for row in rows}
    assert "closed" in loads and len(loads) == 1 + len(report["rates"]) == 6  # the default sweep of 5 rates
    for row in rows:
        assert row["failed"] == 0, row
        if row["load"] == "closed":  # the runtime's own prefix-cache counters read: its 2 prompts repeat
            assert row["prefix_hit_rate"] > 0, row
        assert row["completed"] == (4 if row["load"] == "closed" else 2), row
        assert row["tokens_per_s"] > 0 and row["ttft_p50_s"] > 0, row
    assert "kv_blocks_per_replica" not in report
    assert "kv_blocks_per_replica" in report["smoke"]["not_measured"]


def test_bench_slo_ramp_load(server: RuntimeProcess, tmp_path: Path) -> None:
    """The ramp's clients, requests of the SLO's shape and the attainment; KEDA's arms need a cluster."""
    report = smoke("bench_slo_ramp.py", server, tmp_path / "bench-slo-ramp.json")
    assert report["smoke"]["not_measured"] == {"replicas": "no Deployment: the given server is the one arm"}
    given = report["arms"]["given"]
    assert given["failed"] == 0 and given["completed"] > 0, given
    assert 0 <= given["attainment"] <= 1 and given["ttft_p95_ms"] > 0 and given["itl_p95_ms"] > 0, given
    assert report["ramp"] == [1, 2] and report["shape"] == {"promptTokens": 128, "outputTokens": 32}


def test_bench_budget_load(server: RuntimeProcess, tmp_path: Path) -> None:
    """The two services' loads (batch's steady, chat's two peaks) and chat's attainment; the budget's pods
    need a cluster."""
    report = smoke("bench_budget.py", server, tmp_path / "bench-budget.json")
    assert report["smoke"]["not_measured"] == {"gpus": "no pods: the given server is both services"}
    (given,) = report["runs"]["given"]
    assert given["failed"] == 0 and given["chat_completed"] > 0 and given["batch_completed"] > 0, given
    assert 0 <= given["chat_attainment"] <= 1 and given["chat_attainment_peaks"] is not None, given
    assert "gpu_seconds" not in given and report["summary"]["given"]["batch_completed"]["median"] > 0
    assert report["pattern"]["phases"] == ["valley", "peak", "valley", "peak", "valley"]
