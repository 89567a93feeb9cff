"""``build_store``: config -> store, through a lookup table of backends (Feast style)."""

from __future__ import annotations

import importlib
from typing import Any

from kelp.config import StoreConfig, TableSpec
from kelp.store.base import EmbeddingStore
from prometheus_client import CollectorRegistry

__all__ = ["BACKENDS", "build_store"]

# backend name (StoreConfig.backend) -> "module:class"; imported lazily so the memory
# backend never needs redis-py's cluster machinery.
BACKENDS: dict[str, str] = {
    "memory": "kelp.store.memory:MemoryStore",
    "redis": "kelp.store.redis:RedisStore",
    "redis-cluster": "kelp.store.redis:RedisClusterStore",
}


def backend_class(name: str) -> type[EmbeddingStore]:
    try:
        module, cls = BACKENDS[name].split(":")
    except KeyError:
        raise ValueError(f"unknown store backend {name!r}; expected one of {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), cls)


def build_store(
    store_cfg: StoreConfig,
    tables: list[TableSpec],
    deployment: str = "kelp",
    registry: CollectorRegistry | None = None,
    **kwargs: Any,
) -> EmbeddingStore:
    """The configured backend, wrapped in the hot-row cache when ``store_cfg.hot_cache.enabled``.

    ``kwargs`` go to the backend (``retry=RetryPolicy(...)``, ``initial_state=``, ``seed=``).
    """
    cls = backend_class(store_cfg.backend)
    if store_cfg.backend == "memory":
        store: EmbeddingStore = cls(tables, registry, **kwargs)
    else:
        store = cls(store_cfg, tables, deployment, registry, **kwargs)
    if store_cfg.hot_cache.enabled:
        from kelp.store.hot_cache import HotRowCache

        store = HotRowCache(store, store_cfg.hot_cache)
    return store
