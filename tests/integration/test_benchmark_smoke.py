"""A small run of `make bench-operator` (benchmarks/operator_scale.py) inside `make test`, so that the
benchmark cannot stop working unseen: three InferenceServices instead of 500, a two-second idle period. It
starts its own private control plane, as the full benchmark does; the numbers are not checked against a
target here (the machine is shared), only that both phases ran and measured something."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.repo import REPO

BENCHMARK = REPO / "benchmarks" / "operator_scale.py"


def test_the_operator_benchmark_runs_end_to_end_on_three_services(tmp_path: Path) -> None:
    out = tmp_path / "bench-operator.json"
    argv = [sys.executable, str(BENCHMARK), "--count", "3", "--idle-seconds", "2", "--timeout", "180"]
    two_cpus = len(os.sched_getaffinity(0)) >= 2
    argv += [] if two_cpus else ["--no-pin"]  # pinning needs two CPUs, and says so
    proc = subprocess.run(
        [*argv, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=420,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert result["count"] == 3
    floor, operated = result["floor"], result["operator"]
    assert floor["children_applied_s"] > 0, floor
    assert operated["all_ready_s"] > 0, operated
    assert operated["children_applied_s"] > 0, operated
    # Each service got its children applied (Deployment, Service, PDB, NetworkPolicy) and a status.
    assert operated["writes_per_object_total"] >= 4, operated
    assert result["ratio_all_ready"] > 0, result
    # The CPU each phase cost, from /proc: the API server worked in both, the operator in its own.
    assert floor["cpu_s_until_applied"]["kube-apiserver"] > 0, floor
    assert set(operated["cpu_s_until_applied"]) >= {"kube-apiserver", "etcd", "operator"}, operated
    # Pinned by default where there are two CPUs (the control plane on one, the client on the other).
    assert result["pinned"] is two_cpus, result
