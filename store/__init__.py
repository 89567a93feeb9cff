"""The embedding store: batch-first pull/push of embedding rows with admission, eviction and a hot cache.

Backends (``store.backend``): ``memory`` (numpy arenas, the embedded default),
``redis`` (client-sharded standalone nodes) and ``redis-cluster``. Build one
with :func:`build_store`; every backend passes :mod:`kelp.store.checks`.
"""

from kelp.store.base import EmbeddingStore, PullResult, StoreStats, UnknownTableError
from kelp.store.codec import ROW_FORMAT_VERSION, RowCodec
from kelp.store.factory import BACKENDS, build_store
from kelp.store.hot_cache import HotRowCache
from kelp.store.keys import KEY_LAYOUT_VERSION
from kelp.store.memory import MemoryStore

__all__ = [
    "BACKENDS",
    "KEY_LAYOUT_VERSION",
    "ROW_FORMAT_VERSION",
    "EmbeddingStore",
    "HotRowCache",
    "MemoryStore",
    "PullResult",
    "RowCodec",
    "StoreStats",
    "UnknownTableError",
    "build_store",
]
