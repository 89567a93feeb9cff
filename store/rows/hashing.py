"""Vectorized, process-independent hashing of 64-bit ids.

Everything that must agree across trainers and serving replicas (which shard
holds an id, which cluster bucket, a new row's init values, the hash-map probe
start) derives from :func:`splitmix64`, a counter-based mixer run over whole id
arrays in one native call each (``kelp_native.splitmix64`` and ``rendezvous``,
native/src/hashing.rs; the GIL is released meanwhile). Python's ``hash()`` is
never used: it is salted per process.

>>> int(splitmix64(np.array([0], dtype=np.uint64))[0])
16294208416658607535
"""

from __future__ import annotations

import numpy as np
import xxhash
from kelp_native import rendezvous as _rendezvous
from kelp_native import splitmix64 as _splitmix64

from kelp.buffers import native_array

__all__ = ["name_seed", "rendezvous", "splitmix64"]


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of ``x + golden`` (wrapping): uint64 of any shape -> uint64, same shape.

    A new array each call. ``x`` is anything ``np.asarray(x, dtype=np.uint64)`` takes; a 0-d input
    gives a ``np.uint64`` scalar, as numpy arithmetic on it would.
    """
    z = np.asarray(x, dtype=np.uint64)
    if z.ndim == 0:  # a buffer of no dimensions has no shape to hand over
        return splitmix64(z.reshape(1))[0]
    z = native_array(z, np.uint64)
    out = np.empty(z.shape, dtype=np.uint64)
    _splitmix64(z, out)
    return out


def name_seed(*parts: object) -> np.uint64:
    """A stable 64-bit seed from names (table, shard address...): xxh64 of the joined parts."""
    return np.uint64(xxhash.xxh64_intdigest("\x1f".join(str(p) for p in parts).encode()))


def rendezvous(ids: np.ndarray, shard_seeds: np.ndarray) -> np.ndarray:
    """Highest-random-weight shard for each id: uint64[n] ids, uint64[s] seeds -> int64[n] in [0, s).

    Removing or adding one shard moves only the ids that shard wins (about 1/s of
    them); the other ids keep their shard. Costs one mix per (id, shard).
    """
    if len(shard_seeds) == 1:
        return np.zeros(len(ids), dtype=np.int64)
    ids = native_array(ids, np.uint64)
    out = np.empty(ids.shape, dtype=np.int64)
    _rendezvous(ids, native_array(shard_seeds, np.uint64), out)
    return out
