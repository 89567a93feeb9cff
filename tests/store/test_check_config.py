"""Capabilities are checked at load: check_store_config reports, build_store refuses the same lines."""

from __future__ import annotations

import pytest

from kelp.config import FeatureSpec, HotCacheConfig, StoreConfig, TableSpec
from kelp.errors import ConfigError
from kelp.store import build_store, check_store_config
from kelp.store.factory import BACKENDS, backend_class
from kelp.store.policy.eviction import LfuCapacity, TtlEviction

REDIS_HINT = (
    "store.backend 'redis' does not enforce max_rows; cap memory with Redis maxmemory + maxmemory-policy "
    "allkeys-lfu (docs/store.md), or use backend memory"
)


def test_capabilities_are_declared_by_each_backend() -> None:
    assert backend_class("memory").enforces == {TtlEviction, LfuCapacity}
    for name in ("redis", "redis-cluster"):
        assert backend_class(name).enforces == {TtlEviction}
    assert set(BACKENDS) == {"memory", "redis", "redis-cluster"}


def test_memory_enforces_everything() -> None:
    tables = [TableSpec(name="a", eviction={"ttl_s": 5, "max_rows": 10})]
    assert check_store_config(StoreConfig(), tables) == []


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
def test_redis_reports_max_rows_with_the_config_path(backend: str) -> None:
    cfg = StoreConfig(backend=backend, urls=["redis://127.0.0.1:1"])
    tables = [
        TableSpec(name="a", eviction={"ttl_s": 60}),  # TTL is enforced (PX)
        TableSpec(name="b", eviction={"max_rows": 100}),
        TableSpec(name="c"),
        TableSpec(name="d", eviction={"ttl_s": 1, "max_rows": 5}),
    ]
    problems = check_store_config(cfg, tables)
    hint = REDIS_HINT.replace("'redis'", f"'{backend}'")
    assert problems == [
        ("features.tables[1].eviction.max_rows", hint),
        ("features.tables[3].eviction.max_rows", hint),
    ]


def test_tables_appended_from_table_defaults_keep_their_index() -> None:
    spec = FeatureSpec(
        sparse=[{"name": "user"}, {"name": "item", "table": "items"}],
        tables=[{"name": "items", "dim": 8}],
        table_defaults={"eviction": {"max_rows": 1000}},
    )
    assert [t.name for t in spec.tables] == ["items", "user"]
    cfg = StoreConfig(backend="redis", urls=["redis://127.0.0.1:1"])
    assert [p for p, _ in check_store_config(cfg, list(spec.tables))] == [
        "features.tables[1].eviction.max_rows"
    ]


@pytest.mark.parametrize("hot", [False, True])
def test_build_store_refuses_exactly_what_the_check_reports(hot: bool) -> None:
    """Refused before any connection is opened (the url points nowhere)."""
    cfg = StoreConfig(backend="redis", urls=["redis://127.0.0.1:1"], hot_cache=HotCacheConfig(enabled=hot))
    tables = [TableSpec(name="a"), TableSpec(name="b", eviction={"max_rows": 100})]
    with pytest.raises(ConfigError) as info:
        build_store(cfg, tables)
    assert str(info.value) == f"features.tables[1].eviction.max_rows: {REDIS_HINT}"
    lines = [f"{path}: {problem}" for path, problem in check_store_config(cfg, tables)]
    assert str(info.value).splitlines() == lines
