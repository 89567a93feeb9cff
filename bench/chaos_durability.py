"""Acknowledged row updates against a Redis SIGKILL: pushed through Kelp's store, killed, restarted, counted.

A writer thread pushes versions of the same rows through the production write
path (:func:`~kelp.store.factory.build_store`, default layout): push ``v``
writes every element of each of its rows as ``v``, and once ``push`` returns
(acknowledged by Redis) the writer records ``v`` as the row's acknowledged
version. The caller SIGKILLs Redis while the writer is mid-stream, so the last
acknowledgements land microseconds before the kill; the server restarts on the
same data directory, and every row is read back. An acknowledged update is
lost when the row reads older than its last acknowledged version (a push in
flight at the kill may or may not have landed: newer is fine).

With ``appendonly yes`` + ``appendfsync always`` Redis fsyncs before it
replies, so nothing acknowledged may be lost; with ``everysec`` up to about a
second may be (docs/store.md, "Durability").
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import StoreConfig, TableSpec
from kelp.errors import KelpError
from kelp.harness import RedisServer
from kelp.retry import RetryPolicy
from kelp.store import build_store
from kelp.store.base import EmbeddingStore
from kelp.store.redis.durability import Durability, durability_of

__all__ = ["DurabilityProbe", "probe_acked_updates"]

TABLE = TableSpec(name="probe", dim=8)


@dataclass
class DurabilityProbe:
    """What one kill cost: ``lost`` of ``acked_rows`` acknowledged row versions (0 is the promise)."""

    pushes_acked: int
    acked_rows: int
    lost: int
    durability: list[Durability]


def _store(url: str, deployment: str) -> EmbeddingStore:
    # One attempt: a push in flight at the kill fails at once instead of waiting for the restart.
    cfg = StoreConfig(backend="redis", urls=[url], socket_timeout_s=2.0, connect_timeout_s=2.0)
    return build_store(cfg, [TABLE], deployment, CollectorRegistry(), retry=RetryPolicy(1, 0.0, 0.0))


def probe_acked_updates(
    server: RedisServer, *, rows: int = 256, per_push: int = 32, min_pushes: int = 50, seed: int = 0
) -> DurabilityProbe:
    """Push until ``min_pushes`` were acknowledged, SIGKILL ``server`` mid-stream, restart it, count losses.

    ``server`` must already run; it is running again (same port, same data
    directory) when this returns.
    """
    deployment = f"durability-{uuid.uuid4().hex[:8]}"
    ids = np.arange(1, rows + 1, dtype=np.uint64)
    acked = np.zeros(rows, dtype=np.int64)  # last acknowledged version per row; 0 = never written
    enough = threading.Event()
    stop = threading.Event()
    count = [0]
    gen = np.random.default_rng(seed)

    with _store(server.url, deployment) as store:

        def write() -> None:
            version = 0
            while not stop.is_set():
                version += 1
                pick = np.sort(gen.choice(rows, size=per_push, replace=False))
                values = np.full((per_push, TABLE.dim), float(version), dtype=np.float32)
                try:
                    store.push(TABLE.name, ids[pick], values, np.zeros(per_push, np.float32))
                except KelpError:
                    return  # the kill: this push is not acknowledged
                acked[pick] = version
                count[0] += 1
                if count[0] >= min_pushes:
                    enough.set()

        writer = threading.Thread(target=write, name="durability-writer", daemon=True)
        writer.start()
        if not enough.wait(60):
            stop.set()
            raise RuntimeError(f"only {count[0]} pushes acknowledged in 60 s")
        server.kill()  # SIGKILL while the writer is mid-stream
        stop.set()
        writer.join(30)
        durability = durability_of(store)
    server.start()  # the same port and data directory: Redis replays its append-only file
    with _store(server.url, deployment) as store:
        got = store.pull(TABLE.name, ids, count=False)
    stored = np.where(got.updated_s > 0, got.rows[:, 0], 0.0).astype(np.int64)
    written = acked > 0
    lost = int(np.count_nonzero(written & (stored < acked)))
    return DurabilityProbe(count[0], int(np.count_nonzero(written)), lost, durability)
