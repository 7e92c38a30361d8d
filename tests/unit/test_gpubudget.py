"""The GPU budget's allocation (operator/status/gpubudget.py): targets by guarantee, priority and fair shares;
hand-overs that lower first and raise only into free GPUs; and the problems a budget reports."""

from __future__ import annotations

import random

import pytest

from pagoda.operator.status.gpubudget import Member, allocate, hand_over, problems, remember, shortfall


def member(
    name: str,
    priority: int,
    demand: int,
    guaranteed: int = 1,
    gpus: int = 1,
    ceiling: int = 8,
    holding: int = 0,
) -> Member:
    return Member(("ns", name), priority, gpus, guaranteed, ceiling, demand, holding)


def targets(capacity: int, *members: Member) -> dict[str, int]:
    return {key[1]: count for key, count in allocate(capacity, list(members)).items()}


@pytest.mark.parametrize(
    ("capacity", "members", "expected"),
    [
        # Guarantees first; the rest by priority: chat (100) takes what it asks for, batch (10) the rest.
        (4, [member("chat", 100, 4), member("batch", 10, 4)], {"chat": 3, "batch": 1}),
        # Demand below the pool: everyone gets what it asks for, the rest stays free.
        (8, [member("chat", 100, 2), member("batch", 10, 3)], {"chat": 2, "batch": 3}),
        # Equal priorities share the slack evenly (1 extra each), the odd one by name.
        (7, [member("a", 50, 8), member("b", 50, 8), member("c", 50, 8)], {"a": 3, "b": 2, "c": 2}),
        # Fair in GPUs, not replicas: a 2-GPU member and a 1-GPU member above their guarantees alike.
        (8, [member("big", 50, 8, gpus=2), member("small", 50, 8)], {"big": 2, "small": 4}),
        # A higher priority whose replica no longer fits leaves the GPUs to a lower one (work-conserving).
        (5, [member("big", 100, 8, gpus=2), member("small", 10, 8)], {"big": 2, "small": 1}),
        # maxReplicas caps a demand past it; minReplicas 0 guarantees nothing.
        (6, [member("chat", 100, 9, ceiling=2), member("idle", 10, 0, guaranteed=0)], {"chat": 2, "idle": 0}),
        # No demand above the guarantee: the guarantee holds.
        (4, [member("chat", 100, 0, guaranteed=2), member("batch", 10, 0)], {"chat": 2, "batch": 1}),
    ],
)
def test_targets(capacity: int, members: list[Member], expected: dict[str, int]) -> None:
    assert targets(capacity, *members) == expected
    assert not problems(capacity, members)


def test_demand_changes_move_the_shares() -> None:
    """chat's load comes and goes: batch gives up its extra replicas and gets them back."""
    quiet = targets(6, member("chat", 100, 1), member("batch", 10, 6))
    busy = targets(6, member("chat", 100, 5), member("batch", 10, 6))
    assert quiet == {"chat": 1, "batch": 5}
    assert busy == {"chat": 5, "batch": 1}


def test_a_hand_over_lowers_first_and_raises_only_into_free_gpus() -> None:
    """4 GPUs: batch holds 3, chat 1; chat's load asks for 3. Step 1: batch's limit drops to 1 at once (its
    HPA drains two replicas), chat's stays at 1 (nothing free yet). Step 2: one of batch's pods is gone, chat
    may grow by one. Step 3: both gone, chat gets its 3."""

    def members(batch_holding: int, chat_holding: int) -> list[Member]:
        return [member("chat", 100, 3, holding=chat_holding), member("batch", 10, 4, holding=batch_holding)]

    steps = []
    for batch_holding, chat_holding in [(3, 1), (2, 1), (1, 2)]:
        now = members(batch_holding, chat_holding)
        limits = hand_over(4, now, allocate(4, now))
        steps.append({key[1]: count for key, count in limits.items()})
    assert steps == [{"chat": 1, "batch": 1}, {"chat": 2, "batch": 1}, {"chat": 3, "batch": 1}]


def test_limits_never_drop_below_the_guarantee_or_one() -> None:
    over = [member("chat", 100, 3, guaranteed=2, holding=0), member("zero", 10, 0, guaranteed=0)]
    limits = hand_over(1, over, allocate(1, over))
    assert limits[("ns", "chat")] == 2 and limits[("ns", "zero")] == 1


def test_problems_name_the_field() -> None:
    found = problems(3, [member("chat", 100, 2, guaranteed=2, gpus=1), member("big", 10, 1, gpus=4)])
    assert any(p.startswith("spec.gpus: 3 GPUs cannot cover") and "need 6" in p for p in found), found
    assert any("ns/big: one replica needs 4 GPUs" in p for p in found), found
    assert problems(-1, []) == ["spec.gpus: -1 is negative"]


def test_random_fleets_never_exceed_the_pool_and_honour_priority() -> None:
    """Properties over random fleets: the targets fit the pool; each member gets at least its guarantee and
    at most its demand (or guarantee) and ceiling; no member is short of its demand while a strictly lower
    priority holds more than its guarantee in GPUs it could use; limits applied from any holding fit the pool
    once the drains are done."""
    rng = random.Random(43)
    checked = 0
    for _ in range(500):
        members = [
            member(
                f"s{i}",
                rng.choice([10, 50, 100]),
                rng.randint(0, 6),
                guaranteed=rng.randint(0, 2),
                gpus=rng.choice([1, 1, 2]),
                ceiling=rng.randint(2, 6),
                holding=rng.randint(0, 3),
            )
            for i in range(rng.randint(1, 5))
        ]
        capacity = rng.randint(0, 16)
        if problems(capacity, members):
            continue
        checked += 1
        target = allocate(capacity, members)
        assert sum(target[m.key] * m.gpus for m in members) <= capacity
        for m in members:
            assert (
                min(m.guaranteed, m.ceiling) <= target[m.key] <= max(min(m.demand, m.ceiling), m.guaranteed)
            )
        for high in members:
            if target[high.key] >= min(high.demand, high.ceiling):
                continue
            for low in members:
                if low.priority < high.priority and target[low.key] > low.guaranteed:
                    assert low.gpus < high.gpus, (capacity, members, target)
        limits = hand_over(capacity, members, target)
        for m in members:
            assert limits[m.key] >= max(m.guaranteed, 1)
            assert limits[m.key] <= max(target[m.key], m.guaranteed, 1)
        # What the limits let members grow by now, above what they hold (or their floor), fits the GPUs
        # that are free now: nothing waits for the scheduler to preempt a pod.
        free = capacity - sum(m.holding * m.gpus for m in members)
        grown = sum(max(0, limits[m.key] - max(m.holding, m.guaranteed, 1)) * m.gpus for m in members)
        assert grown <= max(0, free), (capacity, members, limits)
    assert checked > 250  # most random fleets were valid budgets


def test_the_shortfall_says_who_holds_the_pool() -> None:
    members = [member("chat", 100, 3), member("batch", 10, 3), member("idle", 10, 0, guaranteed=0)]
    target = allocate(4, members)
    assert shortfall("team-gpus", 4, members, target, ("ns", "chat")) is None
    assert shortfall("team-gpus", 4, members, target, ("ns", "batch")) == (
        "budget team-gpus is full (4 of 4 GPUs): ns/chat (priority 100) holds 3; this service gets 1 of the "
        "3 replicas it asks for"
    )
    big = [member("big", 10, 3, gpus=2), member("small", 100, 3)]
    target = allocate(6, big)  # small takes 3, big its guaranteed 1: 1 GPU left, big needs 2
    assert shortfall("pool", 6, big, target, ("ns", "big")) == (
        "budget pool has 1 of 6 GPUs left, fewer than one replica's 2: ns/small (priority 100) holds 3; this "
        "service gets 1 of the 3 replicas it asks for"
    )


@pytest.mark.parametrize(
    ("asked", "expected"),
    [
        # (seconds, replicas asked for) read in turn; the demand after each, with a 30 s window
        ([(0, 2), (10, 1), (20, 2), (30, 1)], [2, 2, 2, 2]),  # dips for a poll: held
        ([(0, 3), (10, 1), (29, 1), (30, 1)], [3, 3, 3, 1]),  # low for the whole window: falls
        ([(0, 3), (10, 2), (35, 1), (41, 1)], [3, 3, 2, 1]),  # falls a step at a time as each ages out
        ([(0, 1), (5, 4), (6, 2)], [1, 4, 4]),  # rises at once
    ],
)
def test_demand_rises_at_once_and_falls_after_the_window(
    asked: list[tuple[int, int]], expected: list[int]
) -> None:
    readings: tuple[tuple[float, int], ...] = ()
    seen = []
    for when, value in asked:
        readings = remember(readings, when, value, 30)
        seen.append(readings[0][1])
        assert len(readings) <= 4  # only readings no later one reaches are kept
    assert seen == expected
