"""Admission and eviction strategy classes, each on its own (the backends run them through checks.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kelp.config import AdmissionSpec, EvictionSpec
from kelp.store.policy.admission import AdmitAfterCount, AdmitByChance, AlwaysAdmit, Draws, build_admission
from kelp.store.policy.eviction import LfuCapacity, TtlEviction, build_evictions


def test_always_admit_stores_nothing_on_pull_and_lets_pushes_create_rows() -> None:
    policy = AlwaysAdmit()
    assert policy.admit(3, None).tolist() == [True, True, True]
    assert policy.counter_ttl_s is None and not policy.stores_on_admit and policy.push_creates_rows


def test_admit_after_count_admits_at_min_count() -> None:
    policy = AdmitAfterCount(min_count=3, counter_ttl_s=60)
    assert policy.admit(5, np.array([1, 2, 3, 4, 9])).tolist() == [False, False, True, True, True]
    assert policy.counter_ttl_s == 60 and policy.stores_on_admit and not policy.push_creates_rows
    with pytest.raises(ValueError, match="sighting counts"):
        policy.admit(2, None)
    with pytest.raises(ValueError, match="min_count"):
        AdmitAfterCount(0)
    with pytest.raises(ValueError, match="counter_ttl_s"):
        AdmitAfterCount(2, counter_ttl_s=0)


def test_admit_by_chance_draws_from_the_shared_generator() -> None:
    policy = AdmitByChance(0.25, Draws(seed=7))
    got = policy.admit(20_000, None)
    assert got.dtype == bool and 0.23 < got.mean() < 0.27
    assert policy.counter_ttl_s is None and policy.stores_on_admit and not policy.push_creates_rows
    same = AdmitByChance(0.25, Draws(seed=7)).admit(20_000, None)
    np.testing.assert_array_equal(got, same)  # seeded: reproducible
    with pytest.raises(ValueError, match="probability"):
        AdmitByChance(0.0, Draws())


def test_draws_are_safe_from_several_threads() -> None:
    draws = Draws(seed=1)
    out: list[np.ndarray] = []

    def work() -> None:
        for _ in range(200):
            out.append(draws.uniform(50))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    values = np.concatenate(out)
    assert len(values) == 4 * 200 * 50 and ((values >= 0) & (values < 1)).all()
    assert len(np.unique(values)) == len(values)  # no draw handed out twice


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({}, AlwaysAdmit),
        ({"min_count": 1, "probability": 1.0}, AlwaysAdmit),
        ({"min_count": 4, "counter_ttl_s": 9}, AdmitAfterCount),
        ({"probability": 0.5}, AdmitByChance),
    ],
)
def test_build_admission_picks_one_class_per_rule(spec: dict, expected: type) -> None:
    policy = build_admission(AdmissionSpec(**spec), Draws())
    assert type(policy) is expected
    if isinstance(policy, AdmitAfterCount):
        assert (policy.min_count, policy.counter_ttl_s) == (4, 9)


def test_ttl_eviction() -> None:
    ttl = TtlEviction(2.5)
    assert ttl.expired(np.array([0.0, 7.4, 7.5, 9.0]), now=10.0).tolist() == [True, True, False, False]
    assert ttl.ttl_ms == 2500 and TtlEviction(1e-6).ttl_ms == 1
    with pytest.raises(ValueError):
        TtlEviction(0)


def test_lfu_capacity_picks_least_used_then_oldest_and_protects_the_batch() -> None:
    lfu = LfuCapacity(max_rows=4)
    assert lfu.excess(rows=3, adding=1) == 0 and lfu.excess(rows=4, adding=3) == 3
    slots = np.array([10, 11, 12, 13, 14])
    count = np.array([5, 1, 1, 0, 9], np.uint32)
    updated = np.array([0.0, 2.0, 1.0, 3.0, 0.0])
    none = np.array([], np.int64)
    assert lfu.victims(slots, count, updated, protect=none, excess=3).tolist() == [13, 12, 11]
    assert lfu.victims(slots, count, updated, protect=np.array([13]), excess=2).tolist() == [12, 11]
    with pytest.raises(ValueError):
        LfuCapacity(0)


def test_build_evictions() -> None:
    assert build_evictions(EvictionSpec()) == []
    both = build_evictions(EvictionSpec(ttl_s=30, max_rows=100))
    assert [type(p) for p in both] == [TtlEviction, LfuCapacity]
    assert [p.setting for p in both] == ["ttl_s", "max_rows"]
