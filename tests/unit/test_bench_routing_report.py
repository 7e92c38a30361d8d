"""benchmarks/bench_routing.py's report: the curve a person reads in docs/benchmarks.md. One line per load
(the closed loop first, then the arrival rates in ascending order), each side's median over the rounds, the
median of the per-round tokens/s ratios with their range, and the failures of both sides. The benchmark
itself needs three real replicas (minutes on two cores), so its end-to-end run is `make bench-routing`."""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from tests.repo import REPO

BENCHMARK = REPO / "benchmarks" / "bench_routing.py"
sys.path.insert(0, str(BENCHMARK.parent))  # as when it runs as a script: it imports benchmarks/servers.py
_spec = importlib.util.spec_from_file_location("pagoda_bench_routing", BENCHMARK)
assert _spec is not None and _spec.loader is not None
bench_routing = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = bench_routing  # its dataclasses look their module up
_spec.loader.exec_module(bench_routing)


def row(mode: str, round_: int, rate: float | None, tokens: int, ttft: list[float], failed: int = 0) -> Any:
    result = bench_routing.Result(mode, round_, 10, failed, 10.0, ttft, tokens, 0.5, rate)
    return result.row()


def test_one_line_per_load_closed_first_then_ascending_rates() -> None:
    rows = [
        row(mode, round_, rate, 100, [0.1, 0.2])
        for round_ in (0, 1)
        for rate in (12.5, None, 2.0)
        for mode in ("picker", "round-robin")
    ]
    lines = bench_routing.table(rows).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == [
        "| closed loop (saturated)",
        "| arrivals 2.00/s",
        "| arrivals 12.50/s",
    ]


def test_medians_over_rounds_and_the_ratio_with_its_range() -> None:
    rows = [
        row("picker", 0, None, 130, [0.5, 1.0]),
        row("round-robin", 0, None, 100, [1.0, 2.0], failed=2),
        row("picker", 1, None, 150, [0.5, 1.0]),
        row("round-robin", 1, None, 100, [1.0, 2.0]),
        row("picker", 2, None, 120, [0.5, 1.0]),
        row("round-robin", 2, None, 100, [1.0, 2.0]),
    ]
    [line] = bench_routing.table(rows).splitlines()[2:]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[1] == "13.0 / 10.0"  # tokens/s: 130, 150, 120 over 10 s -> median 13.0
    assert cells[2] == "**1.30x** (1.20-1.50)"
    assert cells[3] == "0.50 / 1.00"  # TTFT p50
    assert cells[6] == "2"  # failed, both sides


def test_load_rate_reads_the_rows_load() -> None:
    assert bench_routing.load_rate("closed") == 0.0
    assert bench_routing.load_rate("open 7.42/s") == 7.42


def test_a_load_where_every_request_failed_is_reported_not_a_crash() -> None:
    rows = [row("picker", 0, 2.0, 0, [], failed=10), row("round-robin", 0, 2.0, 50, [0.3, 0.5])]
    assert rows[0]["ttft_p50_s"] is None and rows[0]["ttft_mean_s"] is None
    (line,) = bench_routing.table(rows).splitlines()[2:]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[3] == "none / 0.30" and cells[4] == "none / 0.50"
    assert cells[6] == "10"
