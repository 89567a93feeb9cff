"""Vectorized, process-independent hashing of 64-bit ids.

Everything that must agree across trainers and serving replicas (which shard
holds an id, which cluster bucket, a new row's init values, the hash-map probe
start) derives from :func:`splitmix64`, a counter-based mixer that numpy runs
over whole id arrays. Python's ``hash()`` is never used: it is salted per process.

>>> int(splitmix64(np.array([0], dtype=np.uint64))[0])
16294208416658607535
"""

from __future__ import annotations

import numpy as np
import xxhash

__all__ = ["name_seed", "rendezvous", "splitmix64"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser of ``x + golden``: uint64[n] -> uint64[n], well mixed."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, dtype=np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


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
    weights = splitmix64(ids[:, None] ^ shard_seeds[None, :])
    return np.argmax(weights, axis=1).astype(np.int64)
