"""Memory backend: TTL (lazy expiry) and the LFU capacity bound, on a fake clock."""

from __future__ import annotations

import numpy as np

from kelp.config import TableSpec
from kelp.store import MemoryStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def _rows(n: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    return np.ones((n, dim), np.float32), np.zeros(n, np.float32)


def test_ttl_expiry_reads_not_admitted_and_discards_pushes() -> None:
    clock = Clock()
    spec = TableSpec(name="t", dim=2, admission={"min_count": 2}, eviction={"ttl_s": 10})
    store = MemoryStore([spec], clock=clock)
    ids = np.arange(5, dtype=np.uint64)
    store.pull("t", ids)
    assert store.pull("t", ids).admitted.all()
    store.push("t", ids, *_rows(5, 2))
    clock.now += 9
    assert store.pull("t", ids, count=False).admitted.all()
    store.push("t", ids[:2], *_rows(2, 2))  # refreshes the TTL of ids 0 and 1
    clock.now += 5
    assert store.pull("t", ids, count=False).admitted.tolist() == [True, True, False, False, False]
    store.push("t", ids, *_rows(5, 2))  # 2..4 are evicted: discarded
    assert store.stats().rows["t"] == 2
    assert store.metrics.evictions.labels(table="t", reason="ttl")._value.get() == 3
    assert store.metrics.push_discarded.labels(table="t")._value.get() == 3


def test_admission_counters_expire() -> None:
    clock = Clock()
    store = MemoryStore(
        [TableSpec(name="t", dim=2, admission={"min_count": 2, "counter_ttl_s": 5})], clock=clock
    )
    ids = np.array([1], np.uint64)
    assert not store.pull("t", ids).admitted[0]
    clock.now += 6  # the first sighting is forgotten
    assert not store.pull("t", ids).admitted[0]
    assert store.pull("t", ids).admitted[0]


def test_lfu_cap_keeps_frequent_rows() -> None:
    clock = Clock()
    store = MemoryStore([TableSpec(name="t", dim=2, eviction={"max_rows": 100})], clock=clock)
    hot = np.arange(50, dtype=np.uint64)
    store.push("t", hot, *_rows(50, 2))
    for _ in range(5):
        store.pull("t", hot)  # access count 5 for the hot half
    for start in range(1000, 3000, 50):
        cold = np.arange(start, start + 50, dtype=np.uint64)
        store.push("t", cold, *_rows(50, 2))
        assert store.stats().rows["t"] <= 100
    assert store.pull("t", hot, count=False).admitted.all()
    assert not store.pull("t", np.arange(1000, 1050, dtype=np.uint64), count=False).admitted.any()
    assert store.metrics.evictions.labels(table="t", reason="lfu")._value.get() == 2000 - 50


def test_stats_count_only_live_rows_and_counters_as_redis_would() -> None:
    """Expiry is lazy in memory, but the rows and counters a user is told about exclude the expired."""
    clock = Clock()
    spec = TableSpec(name="t", dim=2, admission={"min_count": 3, "counter_ttl_s": 20}, eviction={"ttl_s": 10})
    store = MemoryStore([spec], clock=clock)
    ids = np.arange(4, dtype=np.uint64)
    for _ in range(3):
        store.pull("t", ids[:2])  # ids 0 and 1: admitted on their third sighting
    store.push("t", ids[:2], *_rows(2, 2))
    store.pull("t", ids[2:])  # ids 2 and 3: one sighting each, waiting
    stats = store.stats()
    assert stats.rows["t"] == 2 and stats.admission_counters["t"] == 2
    clock.now += 11  # rows past their TTL, counters not yet
    stats = store.stats()
    assert stats.rows["t"] == 0 and stats.admission_counters["t"] == 2
    clock.now += 10  # counters past theirs too
    assert store.stats().admission_counters["t"] == 0
