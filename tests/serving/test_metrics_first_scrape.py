"""Serving's first scrape has no hot-tier metric: it has no hot tier, and a 0 there reads as a cold one."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from kelp.metrics import scrape
from kelp.serving import ServingReplica
from kelp.store.metrics import StoreMetrics

from .helpers import small_config


def test_a_replica_exports_its_store_metrics_but_no_hot_cache_ones(redis_url: str, tmp_path: Path) -> None:
    replica = ServingReplica(small_config(redis_url, tmp_path), CollectorRegistry())
    try:
        text = scrape(replica.registry, replica.metrics.local).decode()
    finally:
        replica.close()
    assert "kelp_store_rows_pulled_total" in text  # the store's own metrics are there
    assert "kelp_store_hot_cache" not in text


def test_a_hot_tier_registers_its_metrics_once_however_often_it_asks() -> None:
    metrics = StoreMetrics()
    assert metrics.registry.get_sample_value("kelp_store_hot_cache_capacity_rows") is None
    metrics.hot_tier()
    metrics.hot_tier()  # a second tier over the same store: no duplicate registration
    metrics.hot_capacity.set(10)
    assert metrics.registry.get_sample_value("kelp_store_hot_cache_capacity_rows") == 10
