"""The serving row cache: off by default; with a TTL, updates show up at most TTL late."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.serving.embeddings import RowFetcher
from kelp.serving.metrics import ServingMetrics
from kelp.store import build_store

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _push(store, value: float) -> None:  # type: ignore[no-untyped-def]
    store.push("C3", np.array([1, 2], np.uint64), np.full((2, 4), value, np.float32), np.zeros(2, np.float32))


@pytest.fixture
def store(cfg):  # type: ignore[no-untyped-def]
    s = build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry())
    yield s
    s.close()


def test_no_cache_sees_every_push(store) -> None:  # type: ignore[no-untyped-def]
    fetcher = RowFetcher(store, ServingMetrics(CollectorRegistry()), cache_ttl_ms=0)
    ids = {"C3": np.array([1, 2, 3], np.uint64)}
    _push(store, 1.0)
    assert fetcher.fetch(ids).rows["C3"][0, 0] == 1.0
    _push(store, 2.0)
    got = fetcher.fetch(ids)
    assert got.rows["C3"][0, 0] == 2.0 and got.stored == 2 and got.default == 1


def test_ttl_cache_serves_the_copy_until_the_ttl(store) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    registry = CollectorRegistry()
    fetcher = RowFetcher(store, ServingMetrics(registry), cache_ttl_ms=500, clock=clock)
    ids = {"C3": np.array([1, 2, 3], np.uint64)}
    _push(store, 1.0)
    first = fetcher.fetch(ids)
    _push(store, 2.0)
    clock.now = 0.49
    cached = fetcher.fetch(ids)
    np.testing.assert_array_equal(cached.rows["C3"], first.rows["C3"])  # within the TTL: the cached copy
    assert cached.stored == 2 and cached.default == 1
    clock.now = 0.5
    assert fetcher.fetch(ids).rows["C3"][0, 0] == 2.0  # at the TTL: re-read
    # only cache misses went to the store: 2 fetches of 3 ids, the cached one needed none
    assert registry.get_sample_value("kelp_serving_store_fetch_seconds_count") == 2
    lookups = {
        result: registry.get_sample_value("kelp_serving_row_cache_lookups_total", {"result": result})
        for result in ("hit", "miss")
    }
    assert lookups == {"hit": 3.0, "miss": 6.0}  # the first fetch and the one at the TTL missed all 3


def test_partial_hits_merge_in_order(store) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    fetcher = RowFetcher(store, ServingMetrics(CollectorRegistry()), cache_ttl_ms=10_000, clock=clock)
    _push(store, 3.0)
    fetcher.fetch({"C3": np.array([2], np.uint64)})
    got = fetcher.fetch({"C3": np.array([3, 2, 1], np.uint64)})
    assert got.rows["C3"][:, 0].tolist() == [0.0, 3.0, 3.0]
    assert got.default == 1


def test_tables_of_several_widths_share_a_cache_per_width_and_match_the_store(
    redis_url: str, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """One cache per row width, the table as the tag: the same id in two tables of one width, and a table
    of another width, each read back as the store holds them, and a partly cached request pulls only
    the rest."""
    from .helpers import small_config

    cfg = small_config(
        redis_url,
        tmp_path,
        features={
            "dense": [],
            "sparse": [{"name": "A"}, {"name": "B"}, {"name": "W"}],
            "tables": [{"name": "A", "dim": 4}, {"name": "B", "dim": 4}, {"name": "W", "dim": 8}],
        },
    )
    registry = CollectorRegistry()
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store:
        for table, dim, value in (("A", 4, 1.0), ("B", 4, 2.0), ("W", 8, 3.0)):
            store.push(
                table, np.array([5], np.uint64), np.full((1, dim), value, np.float32), np.zeros(1, np.float32)
            )
        cached = RowFetcher(store, ServingMetrics(registry), cache_ttl_ms=60_000, clock=Clock())
        plain = RowFetcher(store, ServingMetrics(CollectorRegistry()), cache_ttl_ms=0)
        first = {
            "A": np.array([5], np.uint64),
            "B": np.array([5, 6], np.uint64),
            "W": np.array([5], np.uint64),
        }
        second = {
            "A": np.array([5, 7], np.uint64),
            "B": np.array([6, 5], np.uint64),
            "W": np.array([5], np.uint64),
        }
        for ids in (first, second, second):
            got, want = cached.fetch(ids), plain.fetch(ids)
            for table in ids:
                np.testing.assert_array_equal(got.rows[table], want.rows[table])
            assert (got.stored, got.default) == (want.stored, want.default)
        assert cached._cache_rows == 5  # (A,5) (B,5) (B,6) (W,5), then (A,7)
        # first: all missed; second: only (A, 7) missed; the repeat: nothing to pull
        assert registry.get_sample_value("kelp_serving_store_fetch_seconds_count") == 2
    lookups = {
        result: registry.get_sample_value("kelp_serving_row_cache_lookups_total", {"result": result})
        for result in ("hit", "miss")
    }
    assert lookups == {"hit": 9.0, "miss": 5.0}  # 0 + 4 + 5 rows hit
