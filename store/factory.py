"""``build_store``: config -> store through a lookup table of backends (Feast style); the load-time check.

:func:`check_store_config` reports what the configured backend cannot
enforce (its ``enforces`` capability); :func:`build_store` refuses exactly
what it reports, so ``kelp config validate`` and starting a process can never
disagree.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import StoreConfig, TableSpec
from kelp.errors import ConfigError
from kelp.store.base import EmbeddingStore
from kelp.store.policy.eviction import build_evictions

__all__ = ["BACKENDS", "backend_class", "build_store", "check_store_config"]

# backend name (StoreConfig.backend) -> "module:class"; imported lazily so the memory
# backend never needs redis-py's cluster machinery.
BACKENDS: dict[str, str] = {
    "memory": "kelp.store.memory:MemoryStore",
    "redis": "kelp.store.redis.standalone:RedisStore",
    "redis-cluster": "kelp.store.redis.cluster:RedisClusterStore",
}


LAYOUTS: dict[tuple[str, str], str] = {("redis", "buckets"): "kelp.store.redis.buckets:RedisBucketStore"}
"""(backend, store.layout.kind) -> the class, where the row layout needs its own."""


def backend_class(name: str, layout: str = "keys") -> type[EmbeddingStore]:
    try:
        module, cls = LAYOUTS.get((name, layout), BACKENDS[name]).split(":")
    except KeyError:
        raise ValueError(f"unknown store backend {name!r}; expected one of {', '.join(BACKENDS)}") from None
    return getattr(importlib.import_module(module), cls)


def check_store_config(store_cfg: StoreConfig, tables: list[TableSpec]) -> list[tuple[str, str]]:
    """``(field path, problem)`` for every table setting the configured backend does not enforce.

    ``tables`` is ``features.tables`` as loaded (tables named only by a sparse
    feature are appended there by the config model, with ``table_defaults``), so
    the paths read ``features.tables[<index>].eviction.<field>``. Empty: fine.

    >>> from kelp.config import StoreConfig, TableSpec
    >>> check_store_config(StoreConfig(), [TableSpec(name="t", eviction={"max_rows": 10})])
    []
    """
    cls = backend_class(store_cfg.backend, store_cfg.row_layout)
    problems = []
    for i, spec in enumerate(tables):
        for policy in build_evictions(spec.eviction):
            kind = type(policy)
            if kind in cls.enforces:
                continue
            hint = cls.eviction_hints.get(kind, "use backend memory")
            problems.append(
                (
                    f"features.tables[{i}].eviction.{policy.setting}",
                    f"store.backend '{store_cfg.backend}' does not enforce {policy.setting}; {hint}",
                )
            )
    if store_cfg.sparse_updates == "compose" and cls.composes_updates:
        for i, spec in enumerate(tables):
            if spec.dtype != "float32":
                problems.append(
                    (
                        f"features.tables[{i}].dtype",
                        "store.sparse_updates: compose applies updates to float32 rows only; "
                        "use dtype float32 or sparse_updates: overwrite",
                    )
                )
    return problems


def build_store(
    store_cfg: StoreConfig,
    tables: list[TableSpec],
    deployment: str = "kelp",
    registry: CollectorRegistry | None = None,
    *,
    trainers: int | None = None,
    owned_rows: Callable[[np.ndarray], np.ndarray] | None = None,
    device: Any = "cpu",
    **kwargs: Any,
) -> EmbeddingStore:
    """The configured backend, wrapped in the hot tier when ``store_cfg.hot_tier(trainers)``
    (``trainers``: the size of the trainer group the store is for; None: not for training, so
    ``hot_cache.enabled: auto`` means off; the trainer daemon passes its group's size).

    ``owned_rows``: which ids' rows this trainer writes (bool per id; a trainer group's rank writes the
    rows it owns, :mod:`kelp.daemon.row_owners`), for the tier's staleness rule; None: all.
    ``device``: where the hot tier keeps its row values (the trainer's torch device: HBM under CUDA).
    ``kwargs`` go to the backend (``retry=RetryPolicy(...)``, ``initial_state=``, ``seed=``).
    Raises :class:`~kelp.errors.ConfigError` (one line per problem) for what
    :func:`check_store_config` reports.
    """
    problems = check_store_config(store_cfg, tables)
    if problems:
        raise ConfigError("\n".join(f"{path}: {problem}" for path, problem in problems))
    cls = backend_class(store_cfg.backend, store_cfg.row_layout)
    if store_cfg.backend == "memory":
        store: EmbeddingStore = cls(tables, registry, **kwargs)
    else:
        store = cls(store_cfg, tables, deployment, registry, **kwargs)
    if store_cfg.hot_tier(trainers):
        from kelp.store.hot.working_copy import WorkingCopy

        store = WorkingCopy(store, store_cfg.hot_cache, owned=owned_rows, device=device)
    return store
