"""Tier 3: a small run of `make bench-coldstart` (benchmarks/coldstart.py --smoke --pairs 1), so that the
benchmark cannot stop working unseen, and the node model cache proven through real runtime starts: two
`pagoda-runtime serve` processes on one cache folder, the tiny model in MinIO behind a shaped veth link. The
first start downloads the model and says so in its start-up report; the second finds it and moves no byte.
Timings are not checked against a target here (the machine is shared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.repo import REPO

pytestmark = pytest.mark.runtime

BENCHMARK = REPO / "benchmarks" / "coldstart.py"
RATE_MBIT = 50


def test_the_coldstart_benchmark_runs_and_a_cached_start_downloads_nothing(tmp_path: Path) -> None:
    out = tmp_path / "coldstart.json"
    # 50 Mbit/s: the 12 MB download takes about 2 s, against the cache hit's content check of the same 12 MB
    # (tens of ms). At the benchmark's 1 Gbit/s the two came within 0.5% of each other once on a loaded
    # machine (ratio 1.0), which says nothing about the cache.
    argv = [sys.executable, str(BENCHMARK), "--smoke", "--pairs", "1", "--rate-mbit", str(RATE_MBIT)]
    argv += ["--json", str(out)]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    size = result["modelBytes"]
    assert size > 1_000_000
    assert [s["arm"] for s in result["starts"]] == ["first", "cached"]
    assert result["first"]["fetchedBytes"] == [size]
    assert result["cached"]["fetchedBytes"] == [0]
    for arm in ("first", "cached"):
        assert result[arm]["seconds"]["median"] > 0
        assert result[arm]["engineSetup"]["median"] > 0
    assert result["rateMbit"] == RATE_MBIT
    assert result["ratios"]["modelFetch"] > 2  # no download beats a download, even of 12 MB
