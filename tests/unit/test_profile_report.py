"""Tier 1: `pagoda-runtime profile` without an engine or GuideLLM: the summary of GuideLLM's JSON report (a
real one, trimmed: profile_guidellm_report.json says how it was made) against an SLO, the result's size
bound, and the profile's flags (each bad value named in the error, exit 2)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pagoda.runtime import cli
from pagoda.runtime.profiling import config as flags
from pagoda.runtime.profiling import guidellm
from pagoda.runtime.profiling.config import Slo
from pagoda.runtime.profiling.result import MAX_RESULT_BYTES, result_json, summarize

REPORT = json.loads((Path(__file__).parent / "profile_guidellm_report.json").read_text())
GENEROUS = Slo(ttft_ms=10_000.0, inter_token_ms=1_000.0)
KEYS = {"slo", "shape", "concurrency", "requestsPerSecond", "outputTokensPerSecond", "steps"}
STEP_KEYS = {
    "concurrency",
    "ttftP95Ms",
    "interTokenP95Ms",
    "requestsPerSecond",
    "outputTokensPerSecond",
    "requests",
    "errors",
    "meetsSlo",
}


def p95(benchmark: dict[str, Any], metric: str) -> float:
    return float(benchmark["metrics"][metric]["successful"]["percentiles"]["p95"])


def summary(report: dict[str, Any], slo: Slo, prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The result as the termination message carries it (result.py summarize, as JSON)."""
    return summarize(report, slo, prompt_tokens, output_tokens).wire()


def report_with(edit: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """The real report with, per benchmark index, request totals or p95s replaced."""
    report = copy.deepcopy(REPORT)
    for index, changes in edit.items():
        metrics = report["benchmarks"][index]["metrics"]
        for key, value in changes.items():
            if key in ("successful", "errored"):
                metrics["request_totals"][key] = value
            else:
                metrics[key]["successful"]["percentiles"]["p95"] = value
    return report


def test_the_real_report_within_a_generous_slo_reaches_the_last_step() -> None:
    result = summary(REPORT, GENEROUS, 64, 16)
    assert set(result) == KEYS
    assert result["slo"] == {"ttftMs": 10_000.0, "interTokenMs": 1_000.0}
    assert result["shape"] == {"promptTokens": 64, "outputTokens": 16}
    assert [step["concurrency"] for step in result["steps"]] == [1, 2, 4]
    for step, benchmark in zip(result["steps"], REPORT["benchmarks"], strict=True):
        assert set(step) == STEP_KEYS
        totals = benchmark["metrics"]["request_totals"]
        assert step["requests"] == totals["successful"] + totals["errored"] > 0
        assert step["errors"] == totals["errored"] == 0
        assert step["ttftP95Ms"] == pytest.approx(p95(benchmark, "time_to_first_token_ms"), rel=1e-3)
        assert step["interTokenP95Ms"] == pytest.approx(p95(benchmark, "inter_token_latency_ms"), rel=1e-3)
        rate = benchmark["metrics"]["requests_per_second"]["successful"]["mean"]
        assert step["requestsPerSecond"] == pytest.approx(rate, rel=1e-3) and rate > 0
        assert step["outputTokensPerSecond"] > step["requestsPerSecond"]
        assert step["meetsSlo"] is True
    last = result["steps"][-1]
    assert (result["concurrency"], result["requestsPerSecond"]) == (4, last["requestsPerSecond"])
    assert result["outputTokensPerSecond"] == last["outputTokensPerSecond"]


def test_the_highest_step_within_the_ttft_objective_is_chosen() -> None:
    second, third = (p95(b, "time_to_first_token_ms") for b in REPORT["benchmarks"][1:])
    assert second < third  # the real curve: latency grows with concurrency
    result = summary(REPORT, Slo(ttft_ms=(second + third) / 2, inter_token_ms=1_000.0), 64, 16)
    assert [step["meetsSlo"] for step in result["steps"]] == [True, True, False]
    assert result["concurrency"] == 2
    assert result["requestsPerSecond"] == result["steps"][1]["requestsPerSecond"]


def test_the_inter_token_objective_counts_too() -> None:
    first = p95(REPORT["benchmarks"][0], "inter_token_latency_ms")
    result = summary(REPORT, Slo(ttft_ms=10_000.0, inter_token_ms=first * 0.5), 64, 16)
    assert not any(step["meetsSlo"] for step in result["steps"])
    assert result["concurrency"] is None


def test_a_first_step_that_fails_gives_null_even_when_later_ones_pass() -> None:
    report = report_with({0: {"time_to_first_token_ms": 20_000.0}})
    result = summary(report, GENEROUS, 64, 16)
    assert [step["meetsSlo"] for step in result["steps"]] == [False, True, True]
    assert result["concurrency"] is None
    assert result["requestsPerSecond"] is None and result["outputTokensPerSecond"] is None
    assert len(result["steps"]) == 3


def test_counting_stops_at_the_first_failing_step() -> None:
    report = report_with({1: {"inter_token_latency_ms": 5_000.0}})
    result = summary(report, GENEROUS, 64, 16)
    assert [step["meetsSlo"] for step in result["steps"]] == [True, False, True]
    assert result["concurrency"] == 1


def test_errors_over_five_percent_fail_a_step_and_five_percent_does_not() -> None:
    over = summary(report_with({1: {"successful": 94, "errored": 6}}), GENEROUS, 64, 16)
    assert over["steps"][1]["errors"] == 6 and over["steps"][1]["requests"] == 100
    assert over["steps"][1]["meetsSlo"] is False and over["concurrency"] == 1
    at_limit = summary(report_with({1: {"successful": 95, "errored": 5}}), GENEROUS, 64, 16)
    assert at_limit["steps"][1]["meetsSlo"] is True and at_limit["concurrency"] == 4


def test_a_step_without_a_successful_request_fails_though_its_p95s_read_zero() -> None:
    zero = {"successful": 0, "errored": 0, "time_to_first_token_ms": 0.0, "inter_token_latency_ms": 0.0}
    result = summary(report_with({0: zero}), GENEROUS, 64, 16)
    assert result["steps"][0]["requests"] == 0 and result["steps"][0]["meetsSlo"] is False
    assert result["concurrency"] is None


def test_the_result_fits_a_termination_message_with_the_most_steps_and_long_numbers() -> None:
    template = REPORT["benchmarks"][0]
    benchmarks = []
    for index in range(flags.MAX_STEPS):
        benchmark = copy.deepcopy(template)
        benchmark["config"]["strategy"]["streams"] = 1000 + index
        metrics = benchmark["metrics"]
        metrics["request_totals"].update(successful=123456789, errored=98765)
        for name in ("time_to_first_token_ms", "inter_token_latency_ms"):
            metrics[name]["successful"]["percentiles"]["p95"] = 123456.789123456
        for name in ("requests_per_second", "output_tokens_per_second"):
            metrics[name]["successful"]["mean"] = 98765.4321987654
        benchmarks.append(benchmark)
    slo = Slo(ttft_ms=1e9 + 0.123456789, inter_token_ms=1e9 + 0.987654321)
    measured = summarize({"benchmarks": benchmarks}, slo, 131072, 32768)
    data = result_json(measured)
    assert len(data) <= MAX_RESULT_BYTES and b"\n" not in data
    result = json.loads(data)
    assert result == measured.wire()
    assert len(result["steps"]) == flags.MAX_STEPS  # rounding, not dropping, keeps it short
    assert result["steps"][0]["ttftP95Ms"] == 123500.0 and result["concurrency"] == 1019


def test_steps_past_the_bound_are_dropped_from_the_end_after_the_choice() -> None:
    many = [copy.deepcopy(REPORT["benchmarks"][0]) for _ in range(60)]
    for index, benchmark in enumerate(many):
        benchmark["config"]["strategy"]["streams"] = index + 1
    result = summary({"benchmarks": many}, GENEROUS, 64, 16)
    assert len(json.dumps(result, separators=(",", ":"))) <= MAX_RESULT_BYTES
    assert 1 < len(result["steps"]) < 60
    assert [step["concurrency"] for step in result["steps"]] == list(range(1, len(result["steps"]) + 1))
    assert result["concurrency"] == 60  # chosen from every step, even those left out of the list


def test_a_report_without_what_is_read_names_the_path() -> None:
    broken = copy.deepcopy(REPORT)
    del broken["benchmarks"][1]["metrics"]["inter_token_latency_ms"]
    with pytest.raises(KeyError, match="inter_token_latency_ms.successful.percentiles.p95"):
        summarize(broken, GENEROUS, 64, 16)
    with pytest.raises(KeyError, match="benchmarks"):
        summarize({}, GENEROUS, 64, 16)


def test_serve_gets_every_flag_but_the_profiles() -> None:
    argv = [
        "--model", "file:///m", "--port", "8001", "--slo-ttft-ms", "500", "--slo-itl-ms=50",
        "--streams", "1,2", "--enable-lora", "--step-seconds", "5", "--result", "/tmp/r",
        "--guidellm", "/g", "--tokenizer", "/t", "--target", "http://x", "--max-num-seqs", "4",
        "--prompt-tokens", "8", "--output-tokens", "4", "--tune-engine", "--tune-max-runs", "3",
    ]  # fmt: skip
    assert flags.serve_argv(argv) == [
        "--model", "file:///m", "--port", "8001", "--enable-lora", "--max-num-seqs", "4"
    ]  # fmt: skip


def test_guidellm_runs_offline_on_the_local_tokenizer_with_the_design_notes_settings(tmp_path: Path) -> None:
    config = flags.ProfileConfig(Slo(1, 1), 256, 128, (1, 2, 4), 30.0, "/r", None, None, "/g")
    cmd = guidellm.guidellm_command(config, "http://127.0.0.1:8000", "tiny", "/models/tiny", tmp_path / "r")
    args = {cmd[i]: cmd[i + 1] for i in range(2, len(cmd) - 1) if cmd[i].startswith("--")}
    assert cmd[:3] == ["/g", "run", "--disable-console-interactive"]
    backend = json.loads(args["--backend"])
    assert backend["validate_backend"] is False and backend["model"] == "tiny"
    assert backend["target"] == "http://127.0.0.1:8000" and "api_key" not in backend
    assert json.loads(args["--tokenizer"]) == {"kind": "hf_auto", "model": "/models/tiny"}
    assert json.loads(args["--data"]) == {
        "kind": "synthetic_text",
        "prompt_tokens": 256,
        "output_tokens": 128,
    }
    assert cmd[cmd.index("--override") + 1 : cmd.index("--override") + 3] == ["profile.streams", "1,2,4"]
    assert json.loads(args["--constraint"]) == {"kind": "max_duration", "seconds": 30.0}
    assert json.loads(args["--metrics"])["sample_size"] == 0
    assert json.loads(args["--seed"]) == {"kind": "static", "value": 42}
    assert json.loads(args["--output"]) == {"kind": "json", "path": str(tmp_path / "r")}


# --- flags ----------------------------------------------------------------------------------------------


def run_cli(tmp_path: Path, *flags: str, defaults: bool = True) -> int:
    """`pagoda-runtime profile` with `flags` in this process: its exit status (it must exit)."""
    argv = ["profile", "--model", "file:///models/tiny"]
    if defaults:
        argv += ["--result", str(tmp_path / "result"), "--guidellm", sys.executable]
    with pytest.raises(SystemExit) as exited:
        cli.main([*argv, *flags])
    return int(exited.value.code or 0)


GOOD = ["--slo-ttft-ms", "500", "--slo-itl-ms", "50"]


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--slo-ttft-ms", "0", "--slo-itl-ms", "50"], "--slo-ttft-ms: must be a positive float"),
        (["--slo-ttft-ms", "fast", "--slo-itl-ms", "50"], "--slo-ttft-ms: must be a positive float"),
        (["--slo-ttft-ms", "500", "--slo-itl-ms", "-1"], "--slo-itl-ms: must be a positive float"),
        (["--slo-ttft-ms", "500", "--slo-itl-ms", "nan"], "--slo-itl-ms: must be a positive float"),
        ([*GOOD, "--prompt-tokens", "1.5"], "--prompt-tokens: must be a positive int"),
        ([*GOOD, "--output-tokens", "0"], "--output-tokens: must be a positive int"),
        ([*GOOD, "--streams", "2,1"], "--streams: must be comma-separated positive integers"),
        ([*GOOD, "--streams", "1,,2"], "--streams: must be comma-separated positive integers"),
        ([*GOOD, "--streams", "0,1"], "--streams: must be comma-separated positive integers"),
        ([*GOOD, "--streams", ",".join(map(str, range(1, 22)))], "--streams: at most 20 steps"),
        ([*GOOD, "--step-seconds", "0"], "--step-seconds: must be a positive float"),
        ([*GOOD, "--target", "127.0.0.1:8000", "--tokenizer", "/"], "--target: must be an http://"),
        ([*GOOD, "--target", "http://127.0.0.1:8000"], "--tokenizer: required with --target"),
        ([*GOOD, "--tune-engine", "--tune-max-runs", "2"], "--tune-max-runs: must be at least 3"),
        ([*GOOD, "--tune-engine", "--tune-max-runs", "two"], "--tune-max-runs: must be a positive int"),
        (
            [*GOOD, "--target", "http://127.0.0.1:8000", "--tokenizer", "/", "--tune-engine"],
            "--tune-engine: restarts the server it profiles",
        ),
        ([*GOOD, "--tokenizer", "/nonexistent/tokenizer"], "--tokenizer: '/nonexistent/tokenizer' is not"),
        ([*GOOD, "--guidellm", "/nonexistent/guidellm"], "--guidellm: '/nonexistent/guidellm' is not"),
        ([*GOOD, "--result", "/nonexistent/folder/result"], "--result: the folder of"),
        ([*GOOD, "--port", "0"], "--port: Input should be greater than or equal to 1"),
    ],
)
def test_a_bad_flag_exits_2_naming_it(
    flags: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(tmp_path, *flags)
    err = capsys.readouterr().err
    assert code == 2
    assert f"pagoda-runtime profile: error: {named}" in err or f"; {named}" in err, err


def test_every_bad_flag_is_named_at_once_and_the_reason_goes_to_the_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(tmp_path, "--slo-ttft-ms", "-5", "--slo-itl-ms", "50", "--streams", "4,2")
    err = capsys.readouterr().err
    assert code == 2 and "--slo-ttft-ms:" in err and "--streams:" in err
    written = (tmp_path / "result").read_text()
    assert (
        written.startswith("InvalidConfig: --slo-ttft-ms: must be a positive float")
        and "--streams" in written
    )


@pytest.mark.parametrize("missing", ["--slo-ttft-ms", "--slo-itl-ms"])
def test_the_objectives_are_required(
    missing: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [*GOOD]
    del flags[flags.index(missing) : flags.index(missing) + 2]
    code = run_cli(tmp_path, *flags)
    assert code == 2 and missing in capsys.readouterr().err


def test_without_guidellm_anywhere_the_error_says_where_to_put_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(flags.GUIDELLM_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    code = run_cli(tmp_path, *GOOD, "--result", str(tmp_path / "result"), defaults=False)
    err = capsys.readouterr().err
    assert code == 2 and f"--guidellm: no GuideLLM found (set ${flags.GUIDELLM_ENV}" in err


def test_the_result_defaults_to_the_termination_message_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = cli._parser().parse_args(["profile", "--model", "file:///m", *GOOD, "--guidellm", sys.executable])
    monkeypatch.setenv("PAGODA_TERMINATION_MESSAGE_PATH", str(tmp_path / "message"))
    assert flags.profile_config(ns).result == str(tmp_path / "message")
    monkeypatch.delenv("PAGODA_TERMINATION_MESSAGE_PATH")
    config = flags.profile_config(ns)
    assert config.result == "/dev/termination-log"
    assert (config.prompt_tokens, config.output_tokens, config.step_seconds) == (256, 128, 30.0)
    assert config.streams == (1, 2, 4, 8, 16) and config.target is None


def test_guidellm_gets_a_worker_per_core_at_most_ten(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guidellm.os, "sched_getaffinity", lambda pid: set(range(2)))
    assert guidellm.guidellm_workers() == 2  # not GuideLLM's 10 on this 2-core machine
    monkeypatch.setattr(guidellm.os, "sched_getaffinity", lambda pid: set(range(96)))
    assert guidellm.guidellm_workers() == guidellm.MAX_GUIDELLM_WORKERS == 10
