"""The embedding store: batch-first pull/push of embedding rows with admission, eviction and a hot cache.

Backends (``store.backend``): ``memory`` (numpy slot tables, the embedded
default), ``redis`` (client-sharded standalone nodes) and ``redis-cluster``.
Build one with :func:`build_store`; every backend passes :mod:`kelp.store.checks`.
:func:`check_store_config` reports (and ``build_store`` refuses) table settings
the configured backend cannot enforce. Every Redis connection Kelp opens, and
the translation of redis-py errors, is :mod:`kelp.store.connection`.

Modules: ``base`` (interface, result types), ``backend`` (the pull/push flow on
backend primitives), ``admission`` / ``eviction`` (policy strategy classes),
``slots`` (id -> slot columns), ``memory``, ``redis_plan`` / ``redis_backend`` /
``redis`` / ``redis_cluster`` (Redis), ``hot_cache``, ``connection``,
``errors``, ``codec`` / ``keys`` (versioned wire formats), ``quarantine``
(stored rows that are no valid finite row, non-finite pushes), ``factory``.
"""

from kelp.store.admission import AdmissionPolicy, AdmitAfterCount, AdmitByChance, AlwaysAdmit
from kelp.store.base import EmbeddingStore, PullResult, StoreStats, UnknownTableError
from kelp.store.codec import ROW_FORMAT_VERSION, RowCodec
from kelp.store.eviction import EvictionPolicy, LfuCapacity, TtlEviction
from kelp.store.factory import BACKENDS, build_store, check_store_config
from kelp.store.keys import KEY_LAYOUT_VERSION
from kelp.store.memory import MemoryStore
from kelp.store.slots import Column, SlotTable


def __getattr__(name: str) -> object:
    """``HotRowCache`` on first use: it needs torch, and ``import kelp.store.hashing`` should not."""
    if name == "HotRowCache":
        from kelp.store.hot_cache import HotRowCache

        return HotRowCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BACKENDS",
    "KEY_LAYOUT_VERSION",
    "ROW_FORMAT_VERSION",
    "AdmissionPolicy",
    "AdmitAfterCount",
    "AdmitByChance",
    "AlwaysAdmit",
    "Column",
    "EmbeddingStore",
    "EvictionPolicy",
    "HotRowCache",
    "LfuCapacity",
    "MemoryStore",
    "PullResult",
    "RowCodec",
    "SlotTable",
    "StoreStats",
    "TtlEviction",
    "UnknownTableError",
    "build_store",
    "check_store_config",
]
