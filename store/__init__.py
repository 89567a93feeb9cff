"""The embedding store: batch-first pull/push of embedding rows with admission, eviction and a hot cache.

Backends (``store.backend``): ``memory`` (numpy slot tables, the embedded
default), ``redis`` (client-sharded standalone nodes) and ``redis-cluster``.
Build one with :func:`build_store`; every backend passes :mod:`kelp.store.checks`.
:func:`check_store_config` reports (and ``build_store`` refuses) table settings
the configured backend cannot enforce. Every Redis connection Kelp opens, and
the translation of redis-py errors, is :mod:`kelp.store.redis.connection`.

Layout (docs/store.md): at the top the interface and the flow (``base``,
``flow``: the pull/push flow on backend primitives), ``factory``, ``checks``
(the contract suite), ``memory``, ``errors``, ``metrics``, ``quarantine``;
``policy/`` (admission, eviction, fallback rows, initial rows); ``rows/`` (the
codec, hashing, the id index, slot tables, id sets); ``hot/`` (the hot tier, its
rows, sketch and write-back); ``redis/`` (connections, ACL, durability, key
layouts, the standalone and cluster stores, their plans and scripts) with the
wire code private to it in ``redis/_wire/``.
"""

from kelp.store.base import EmbeddingStore, PullResult, StoreStats, UnknownTableError
from kelp.store.factory import BACKENDS, build_store, check_store_config
from kelp.store.memory import MemoryStore
from kelp.store.policy.admission import AdmissionPolicy, AdmitAfterCount, AdmitByChance, AlwaysAdmit
from kelp.store.policy.eviction import EvictionPolicy, LfuCapacity, TtlEviction
from kelp.store.redis.keys import KEY_LAYOUT_VERSION
from kelp.store.rows.codec import ROW_FORMAT_VERSION, RowCodec
from kelp.store.rows.slots import Column, SlotTable


def __getattr__(name: str) -> object:
    """``HotRowCache`` on first use: it needs torch, and ``import kelp.store.rows.hashing`` should not."""
    if name == "HotRowCache":
        from kelp.store.hot.tier import HotRowCache

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
