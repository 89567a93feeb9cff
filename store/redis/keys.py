"""Redis key layout (version ``k1``), namespaced by deployment and table.

Standalone shards (client-side sharding)::

    k1:<deployment>:<table>:r:<id as 8 bytes big-endian>   the row (see codec.py)
    k1:<deployment>:<table>:c:<id as 8 bytes big-endian>   admission sighting counter

Redis Cluster adds a hash tag naming one of ``buckets`` buckets per table, so
all keys of a bucket share a slot and one MGET/MSET carries many rows::

    {k1:<deployment>:<table>:<bucket, 4 digits>}r:<id bytes>

The id is raw binary (8 bytes instead of up to 20 digits) to keep keys short:
Redis memory per row is dominated by key + value + dict overhead.
Bumping the layout version (``k1`` -> ``k2``) makes old keys invisible.
"""

from __future__ import annotations

import numpy as np

from kelp.store.rows.hashing import name_seed, splitmix64

__all__ = ["KEY_LAYOUT_VERSION", "BucketLayout", "KeyLayout", "quote_key"]

KEY_LAYOUT_VERSION = 1


def quote_key(raw: bytes) -> str:
    """A binary key (or hash field) as ``redis-cli`` reads it back: double-quoted, other bytes ``\\xHH``.

    Log lines and errors name keys this way, so an operator can paste one into ``redis-cli``.

    >>> print(quote_key(b'k1:d:t:r:\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x05'))
    "k1:d:t:r:\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x05"
    """
    out = "".join(chr(c) if 32 <= c < 127 and c not in (34, 92) else f"\\x{c:02x}" for c in bytes(raw))
    return f'"{out}"'


class KeyLayout:
    """Builds row and counter keys for one table, vectorized over ids."""

    def __init__(self, deployment: str, table: str, cluster_buckets: int | None = None) -> None:
        self.deployment = deployment
        self.table = table
        self.buckets = cluster_buckets
        self.seed = name_seed("bucket", deployment, table)
        base = f"k{KEY_LAYOUT_VERSION}:{deployment}:{table}"
        if cluster_buckets is None:
            self._row_prefix = np.array([f"{base}:r:".encode()])
            self._cnt_prefix = np.array([f"{base}:c:".encode()])
        else:
            self._row_prefix = np.array([f"{{{base}:{b:04d}}}r:".encode() for b in range(cluster_buckets)])
            self._cnt_prefix = np.array([f"{{{base}:{b:04d}}}c:".encode() for b in range(cluster_buckets)])
        plen = self._row_prefix.dtype.itemsize
        self._rec = np.dtype([("p", f"S{plen}"), ("id", ">u8")])
        self._void = np.dtype(f"V{self._rec.itemsize}")
        self.key_width = self._rec.itemsize
        """Bytes of every row key of this table (the prefix has one width for every bucket)."""
        self.pattern = (
            f"k{KEY_LAYOUT_VERSION}:{deployment}:{table}:r:*"
            if cluster_buckets is None
            else f"{{k{KEY_LAYOUT_VERSION}:{deployment}:{table}:*}}r:*"
        )
        """SCAN MATCH pattern of this table's rows (``counter_pattern``: its admission counters)."""
        self.counter_pattern = self.pattern[: -len("r:*")] + "c:*"

    def bucket_of(self, ids: np.ndarray) -> np.ndarray:
        """int64[n] cluster bucket of each id (zeros for standalone)."""
        if self.buckets is None:
            return np.zeros(len(ids), dtype=np.int64)
        return (splitmix64(ids ^ self.seed) % np.uint64(self.buckets)).astype(np.int64)

    def _key_array(self, prefixes: np.ndarray, ids: np.ndarray, buckets: np.ndarray | None) -> np.ndarray:
        rec = np.empty(len(ids), dtype=self._rec)
        rec["p"] = prefixes[0] if buckets is None or self.buckets is None else prefixes[buckets]
        rec["id"] = ids
        return rec.view(self._void)

    def _keys(self, prefixes: np.ndarray, ids: np.ndarray, buckets: np.ndarray | None) -> list[bytes]:
        return self._key_array(prefixes, ids, buckets).tolist()

    def row_keys(self, ids: np.ndarray, buckets: np.ndarray | None = None) -> list[bytes]:
        return self._keys(self._row_prefix, ids, buckets)

    def row_key_array(self, ids: np.ndarray, buckets: np.ndarray | None = None) -> np.ndarray:
        """The row keys as one fixed-width ``V<w>`` array.

        For :func:`~kelp.store.redis._wire.packing.pack_runs`."""
        return self._key_array(self._row_prefix, ids, buckets)

    def counter_keys(self, ids: np.ndarray, buckets: np.ndarray | None = None) -> list[bytes]:
        return self._keys(self._cnt_prefix, ids, buckets)

    def bucket_tag(self, bucket: int) -> bytes:
        """A key of the bucket (for computing its cluster slot)."""
        return bytes(self._row_prefix[bucket])


class BucketLayout:
    """Row keys of the ``buckets`` layout (version ``k2``): each row is a field of one of ``buckets`` hashes.

    ::

        k2:<deployment>:<table>:h:<bucket as 4 bytes big-endian>   hash: field <id as 8 bytes big-endian>
                                                                     -> the row value (codec.py)

    Every key of a table has the same width, so a batch of per-row commands is
    packed as fixed-width records (:mod:`kelp.store.redis._wire.packing`). Admission counters
    keep the ``k1`` counter keys of :class:`KeyLayout`.

    >>> layout = BucketLayout("d", "t", buckets=8)
    >>> layout.bucket_keys(np.array([3]))[0].tobytes()
    b'k2:d:t:h:\\x00\\x00\\x00\\x03'
    """

    def __init__(self, deployment: str, table: str, buckets: int) -> None:
        self.buckets = buckets
        self.seed = name_seed("bucket-k2", deployment, table)
        self.prefix = f"k2:{deployment}:{table}:h:".encode()
        self.key_dtype = np.dtype([("p", f"S{len(self.prefix)}"), ("b", ">u4")])
        """A bucket key as a record: the table's prefix, then the bucket as 4 bytes big-endian."""
        self.key_width = self.key_dtype.itemsize
        self.pattern = f"k2:{deployment}:{table}:h:*"
        """SCAN MATCH pattern of this table's bucket hashes."""

    def bucket_of(self, ids: np.ndarray) -> np.ndarray:
        """int64[n] bucket of each uint64 id."""
        return (splitmix64(ids ^ self.seed) % np.uint64(self.buckets)).astype(np.int64)

    def bucket_keys(self, buckets: np.ndarray) -> np.ndarray:
        """The hash key of each bucket, as a fixed-width void array."""
        rec = np.empty(len(buckets), dtype=self.key_dtype)
        rec["p"] = self.prefix
        rec["b"] = buckets
        return rec.view(f"V{self.key_width}")

    @staticmethod
    def fields(ids: np.ndarray) -> np.ndarray:
        """The field of each id: 8 bytes big-endian, as a void array."""
        return np.asarray(ids, dtype=np.uint64).astype(">u8").view("V8")
