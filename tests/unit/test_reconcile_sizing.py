"""status.sizing: the load against the measured capacity at spec.slo, the replicas it needs and the cost of
1M tokens there, from status.profile, the autoscaler's in-flight reading (an HPA as KEDA writes it) and
spec.cost."""

from __future__ import annotations

from typing import Any

import pytest

from pagoda.operator.api import InferenceServiceStatus
from pagoda.operator.status.changes import status_changed
from pagoda.operator.status.report import Observed, compute_status
from pagoda.operator.status.scaling import autoscaling_status
from pagoda.operator.status.sizing import cost_per_million_tokens, in_flight_total, sizing_status
from tests.unit.test_reconcile_scaling import SCALED_OBJECT, hpa
from tests.unit.test_status_contract import NOW, OWNER, URL, deployment

SPEC: dict[str, Any] = {
    "slo": {"ttftMs": 500, "interTokenMs": 50},
    "resources": {"gpu": {"count": 2}},
    "cost": {"gpuHourPrice": 2.5},
}
PROFILE = {"job": "m-profile-1", "state": "Succeeded", "concurrency": 4, "outputTokensPerSecond": 500.0}


def autoscaling(current: int, in_flight_per_replica: str | None) -> dict[str, Any]:
    """status.autoscaling as the operator writes it from KEDA's HPA (in-flight per replica, kv-cache)."""
    return autoscaling_status(hpa(current, current, in_flight_per_replica, "350m", None), SCALED_OBJECT, None)


def test_the_load_is_the_in_flight_reading_against_the_ready_replicas_capacity() -> None:
    # 3.5 per replica on 2 replicas: 7 in flight; 2 Ready replicas of 4 each serve 8 within the SLO; the
    # HPA of metric SLO aims at 0.8 x 4 = 3 per replica, so 7 in flight need 3 replicas (not 7 / 4 -> 2).
    sizing = sizing_status(SPEC, PROFILE, autoscaling(2, "3500m"), ready_replicas=2)
    assert sizing == {
        "inFlight": 7.0,
        "capacity": 8,
        "loadPercent": 88,
        "targetPerReplica": 3,
        "replicasNeeded": 3,
        # 2.5 per GPU-hour x 2 GPUs / (500 tokens/s x 3600 s) x 1M
        "costPerMillionTokens": 2.7778,
        "currency": "USD",
    }


def test_a_load_above_the_capacity_reads_over_100_percent_and_asks_for_more_replicas() -> None:
    sizing = sizing_status(SPEC, PROFILE, autoscaling(1, "9"), ready_replicas=1)
    assert sizing is not None
    assert (sizing["loadPercent"], sizing["replicasNeeded"]) == (225, 3)  # 9 / 3 per replica


def test_no_ready_replica_has_no_percent_but_still_says_what_the_load_needs() -> None:
    sizing = sizing_status(SPEC, PROFILE, autoscaling(1, "5"), ready_replicas=0)
    assert sizing is not None
    assert "loadPercent" not in sizing
    assert (sizing["capacity"], sizing["replicasNeeded"], sizing["inFlight"]) == (0, 2, 5.0)


def test_without_an_in_flight_reading_only_capacity_and_cost_are_known() -> None:
    queue_depth = {
        "currentReplicas": 1,
        "triggers": [{"name": "queue-depth", "value": "3", "target": "4", "perReplica": True}],
    }
    unknown = autoscaling(1, None)  # the HPA has not read the metric yet
    for reading in (queue_depth, unknown, None):
        sizing = sizing_status(SPEC, PROFILE, reading, ready_replicas=1)
        assert sizing == {
            "capacity": 4,
            "targetPerReplica": 3,
            "costPerMillionTokens": 2.7778,
            "currency": "USD",
        }, reading


def test_nothing_without_an_slo_or_a_profile() -> None:
    assert sizing_status({**SPEC, "slo": None}, PROFILE, autoscaling(1, "1"), 1) is None
    assert sizing_status(SPEC, None, autoscaling(1, "1"), 1) is None
    running = {"job": "m-profile-1", "state": "Running"}  # nothing measured yet and no price: nothing
    assert sizing_status({"slo": SPEC["slo"]}, running, None, 1) is None


def test_a_failed_profile_keeps_no_concurrency_and_so_no_load_figures() -> None:
    failed = {"job": "m-profile-1", "state": "Failed", "message": "no step met the SLO"}
    assert sizing_status(SPEC, failed, autoscaling(1, "2"), 1) == {"inFlight": 2.0}


@pytest.mark.parametrize(
    "spec, tokens",
    [
        ({"resources": {"gpu": {"count": 1}}}, 500.0),  # no spec.cost
        ({"cost": {"gpuHourPrice": 2.5}}, 500.0),  # no GPU count
        ({"cost": {"gpuHourPrice": "2.5"}, "resources": {"gpu": {"count": 1}}}, 500.0),  # stored as a string
        ({"cost": {"gpuHourPrice": 2.5}, "resources": {"gpu": {"count": True}}}, 500.0),
        ({"cost": {"gpuHourPrice": 2.5}, "resources": {"gpu": {"count": 1}}}, None),  # not measured
        ({"cost": {"gpuHourPrice": 2.5}, "resources": {"gpu": {"count": 1}}}, 0.0),
    ],
)
def test_no_cost_without_a_valid_price_gpu_count_and_throughput(spec: dict[str, Any], tokens: Any) -> None:
    assert cost_per_million_tokens(spec, tokens) is None


def test_the_currency_is_the_specs() -> None:
    spec = {**SPEC, "cost": {"gpuHourPrice": 1.0, "currency": "EUR"}}
    sizing = sizing_status(spec, {**PROFILE, "outputTokensPerSecond": 1000.0}, None, 1)
    assert sizing is not None
    assert (sizing["costPerMillionTokens"], sizing["currency"]) == (0.5556, "EUR")


def test_a_total_value_counts_as_it_is_and_zero_replicas_hold_nothing() -> None:
    total = {"currentReplicas": 3, "triggers": [{"name": "in-flight", "value": "6", "perReplica": False}]}
    assert in_flight_total(total) == 6
    assert in_flight_total(autoscaling(0, "4")) == 0
    garbled = {"currentReplicas": 1, "triggers": [{"name": "in-flight", "value": "n/a", "perReplica": True}]}
    assert in_flight_total(garbled) is None


def test_compute_status_reports_sizing_that_fits_the_status_model_and_drops_it_with_the_slo() -> None:
    owner = {**OWNER, "spec": SPEC}
    observed = Observed(
        deployment(2, 2, 2),
        url=URL,
        hpa=hpa(2, 2, "3", "350m", None),
        scaled_object=SCALED_OBJECT,
        profile=PROFILE,
    )
    status = compute_status(owner, observed, selector="a=b", now=NOW)
    assert status["sizing"] == {
        "inFlight": 6.0,
        "capacity": 8,
        "loadPercent": 75,
        "targetPerReplica": 3,
        "replicasNeeded": 2,
        "costPerMillionTokens": 2.7778,
        "currency": "USD",
    }
    model = InferenceServiceStatus.model_validate(status)
    assert model.model_dump(by_alias=True, exclude_none=True)["sizing"] == status["sizing"]
    # The SLO removed: no profile, no sizing, and the stale one counts as a change to write.
    without = compute_status(
        {**OWNER, "spec": {"resources": SPEC["resources"]}},
        Observed(deployment(2, 2, 2), url=URL, hpa=observed.hpa, scaled_object=SCALED_OBJECT),
        selector="a=b",
        now=NOW,
    )
    assert "sizing" not in without
    assert status_changed(status, without)
