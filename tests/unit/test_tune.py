"""Tier 1: the engine tuning's choices (runtime/profiling/tune.py) on profile results shaped like the
runtime's: which objective binds, the candidates that follow from it, which settings the replica leaves to
tune, and the choice with its 5% threshold. The servers themselves are started by tier 3
(tests/runtime/test_rt_tune.py)."""

from __future__ import annotations

import pytest

from pagoda import contract
from pagoda.contract.payloads import ProfileResult, ProfileSlo, ProfileStep
from pagoda.runtime.profiling import tune
from pagoda.runtime.profiling.tune import Batch, Limits, Run
from pagoda.runtime.serving.config import ServeConfig

CPU_DEFAULTS = Limits(max_num_batched_tokens=2048, max_num_seqs=128)
BOTH = frozenset({"max_num_batched_tokens", "max_num_seqs"})


def result(*steps: tuple[int, float, float, float], ttft: float = 500.0, itl: float = 25.0) -> ProfileResult:
    """A profile result at SLO `ttft`/`itl` from (concurrency, TTFT p95, ITL p95, requests/s) steps, with the
    capacity counted as runtime/profiling/result.py counts it."""
    rows = [
        ProfileStep(
            concurrency=c,
            ttft_p95_ms=t,
            inter_token_p95_ms=i,
            requests_per_second=r,
            output_tokens_per_second=r * 100,
            requests=100,
            errors=0,
            meets_slo=t <= ttft and i <= itl,
        )
        for c, t, i, r in steps
    ]
    chosen = None
    for row in rows:
        if not row.meets_slo:
            break
        chosen = row
    return ProfileResult(
        slo=ProfileSlo(ttft_ms=ttft, inter_token_ms=itl),
        concurrency=chosen.concurrency if chosen else None,
        requests_per_second=chosen.requests_per_second if chosen else None,
        steps=rows,
    )


def measured(goodput: float | None, concurrency: int | None) -> ProfileResult:
    """A result with only its capacity: what the choice reads."""
    slo = ProfileSlo(ttft_ms=500.0, inter_token_ms=25.0)
    return ProfileResult(slo=slo, concurrency=concurrency, requests_per_second=goodput)


# Measured shapes (docs/design/2026-12-04-engine-settings-for-goodput.md): inter-token latency breaks at 16.
ITL_BINDS = result((1, 100, 5, 2.5), (4, 350, 12, 4.0), (8, 490, 21, 5.0), (16, 480, 41, 4.0))
TTFT_BINDS = result((1, 100, 5, 2.5), (4, 350, 12, 4.0), (8, 490, 21, 5.0), (16, 1280, 24, 4.0))


def test_the_objective_missed_by_more_binds_and_none_when_no_step_or_the_first_misses() -> None:
    assert tune.binding(ITL_BINDS) == "interToken"
    assert tune.binding(TTFT_BINDS) == "ttft"
    assert tune.binding(result((1, 100, 5, 2.5), (2, 150, 8, 3.0))) is None  # every step meets it
    assert tune.binding(result((1, 900, 5, 2.5), (2, 950, 8, 3.0))) is None  # even one stream misses


def test_inter_token_latency_binding_tries_smaller_budgets_then_narrower_batches() -> None:
    baseline = Run(Batch(), CPU_DEFAULTS, ITL_BINDS)
    budgets = tune.budget_candidates(baseline, BOTH)
    assert budgets == [Batch(1024), Batch(512), Batch(256)]
    best = Run(Batch(512), Limits(512, 128), ITL_BINDS)
    room = contract.TUNE_MAX_RUNS - 1 - len(budgets)
    assert room == 2
    assert tune.width_candidates(best, baseline, BOTH, 320, room) == [Batch(512, 8), Batch(512, 12)]


def test_the_first_width_is_what_the_kv_cache_holds_whole_then_the_capacity() -> None:
    # A KV cache of 2,048 tokens holds 4 requests of 256 + 256 tokens: beyond that vLLM preempts.
    baseline = Run(Batch(), Limits(2048, 128, kv_cache_tokens=2048), TTFT_BINDS)
    assert tune.width_candidates(baseline, baseline, BOTH, 512, 2) == [Batch(None, 4), Batch(None, 8)]
    assert tune.width_candidates(baseline, baseline, BOTH, 512, 5) == [
        Batch(None, 4),
        Batch(None, 8),
        Batch(None, 12),
    ]
    roomy = Run(Batch(), Limits(2048, 128, kv_cache_tokens=1_000_000), TTFT_BINDS)  # holds 1,953: no limit
    assert tune.width_candidates(roomy, roomy, BOTH, 512, 5) == [Batch(None, 8), Batch(None, 12)]


def test_time_to_first_token_binding_tries_larger_budgets() -> None:
    baseline = Run(Batch(), CPU_DEFAULTS, TTFT_BINDS)
    assert tune.budget_candidates(baseline, BOTH) == [Batch(4096), Batch(8192)]


def test_a_budget_below_the_width_takes_the_width_down_only_when_the_width_is_free() -> None:
    h100 = Run(Batch(), Limits(max_num_batched_tokens=8192, max_num_seqs=1024), ITL_BINDS)
    assert tune.budget_candidates(h100, BOTH) == [Batch(4096), Batch(2048), Batch(1024)]
    small = Run(Batch(), Limits(max_num_batched_tokens=512, max_num_seqs=128), ITL_BINDS)
    assert tune.budget_candidates(small, BOTH) == [Batch(256), Batch(128), Batch(64, 64)]
    assert tune.budget_candidates(small, frozenset({"max_num_batched_tokens"})) == [Batch(256), Batch(128)]


def test_nothing_is_tried_for_a_setting_the_replica_gives() -> None:
    baseline = Run(Batch(), CPU_DEFAULTS, ITL_BINDS)
    assert tune.budget_candidates(baseline, frozenset({"max_num_seqs"})) == []
    assert tune.width_candidates(baseline, baseline, frozenset({"max_num_batched_tokens"}), 320, 5) == []
    every_step_met = Run(Batch(), CPU_DEFAULTS, result((1, 100, 5, 2.5), (2, 150, 8, 3.0)))
    assert tune.width_candidates(every_step_met, every_step_met, BOTH, 320, 5) == []
    assert tune.budget_candidates(Run(Batch(), None, ITL_BINDS), BOTH) == []  # limits unknown
    assert tune.budget_candidates(Run(Batch(), CPU_DEFAULTS, None, "failed"), BOTH) == []


@pytest.mark.parametrize(
    ("flags", "extra", "free"),
    [
        ({}, (), BOTH),
        ({"max_num_seqs": 8}, (), {"max_num_batched_tokens"}),
        ({"max_num_batched_tokens": 512}, (), {"max_num_seqs"}),
        ({}, ("--max-num-batched-tokens", "512"), {"max_num_seqs"}),
        ({}, ("--max_num_seqs=8", "--enforce-eager"), {"max_num_batched_tokens"}),
        ({"max_num_seqs": 8}, ("--max-num-batched-tokens=512",), set()),
    ],
)
def test_tunable_settings_are_those_neither_a_flag_nor_an_extra_argument_gives(
    flags: dict[str, int], extra: tuple[str, ...], free: set[str]
) -> None:
    serve = ServeConfig(model="file:///m", extra_args=extra, **flags)  # type: ignore[arg-type]
    assert tune.tunable(serve) == free


def run(batch: Batch, goodput: float | None) -> Run:
    return Run(batch, CPU_DEFAULTS, measured(goodput, 8 if goodput else None))


def test_the_choice_needs_a_5_percent_gain_and_prefers_the_first_of_equals() -> None:
    baseline = run(Batch(), 5.0)
    assert tune.choose([baseline, run(Batch(1024), 5.2)]) is baseline  # 4%: not worth a change
    better = run(Batch(512), 5.3)
    assert tune.choose([baseline, run(Batch(1024), 5.2), better, run(Batch(256), 5.3)]) is better
    assert tune.choose([run(Batch(), None), better]) is better  # the baseline met the SLO at no step
    failed = Run(Batch(256), None, None, "did not start")
    assert tune.choose([run(Batch(), None), failed]).batch == Batch()


def test_a_winner_must_also_beat_the_baselines_second_run() -> None:
    """Two runs of the same server differ by 10-15% here (docs/benchmarks.md): a candidate that beat an
    unlucky first run of the baseline must beat its better run."""
    first, candidate = run(Batch(), 3.75), run(Batch(512), 5.25)
    assert tune.choose([first, candidate]) is candidate  # before the second run
    assert tune.choose([first, candidate, run(Batch(), 5.1)]) is first  # 5.25 < 1.05 x 5.1
    assert tune.choose([first, candidate, run(Batch(), 4.5)]) is candidate
    assert tune.baseline_goodput([first, candidate, run(Batch(), 5.0)]) == 5.0
    assert tune.baseline_goodput([Run(Batch(), None, None, "x"), candidate]) is None


def test_the_engine_result_names_the_choice_its_gain_and_every_run() -> None:
    baseline = Run(Batch(), CPU_DEFAULTS, measured(5.0, 8))
    chosen = Run(Batch(512, 8), Limits(512, 8), measured(6.5, 16))
    failed = Run(Batch(256), None, None, "did not start")
    engine = tune.engine_result([baseline, failed, chosen], chosen).wire()
    assert engine == {
        "maxNumBatchedTokens": 512,
        "maxNumSeqs": 8,
        "goodput": 6.5,
        "baselineGoodput": 5.0,
        "candidates": [
            {"maxNumBatchedTokens": None, "maxNumSeqs": None, "concurrency": 8, "requestsPerSecond": 5.0},
            {"maxNumBatchedTokens": 256, "maxNumSeqs": None, "concurrency": None, "requestsPerSecond": None},
            {"maxNumBatchedTokens": 512, "maxNumSeqs": 8, "concurrency": 16, "requestsPerSecond": 6.5},
        ],
    }
    assert Batch(512, 8).flags() == ["--max-num-batched-tokens", "512", "--max-num-seqs", "8"]
