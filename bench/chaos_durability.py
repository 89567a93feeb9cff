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
import time
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

__all__ = ["DurabilityProbe", "VersionedRows", "probe_acked_updates"]

TABLE = TableSpec(name="probe", dim=8)


class VersionedRows:
    """Versions of the same rows pushed through a store: push ``v`` writes ``v`` in every element
    of the rows it picks, and once the store acknowledges it ``v`` is each row's acknowledged
    version. A read afterwards counts the acknowledged versions the store lost: rows older than
    their last acknowledged version (a push in flight at a fault may or may not land: newer is fine).
    """

    def __init__(self, rows: int, per_push: int, seed: int = 0) -> None:
        self.ids = np.arange(1, rows + 1, dtype=np.uint64)
        self.acked = np.zeros(rows, dtype=np.int64)
        """Each row's last acknowledged version; 0: never acknowledged."""
        self.per_push = per_push
        self.version = 0
        self.pushes_acked = 0
        self._gen = np.random.default_rng(seed)

    def push(self, store: EmbeddingStore) -> bool:
        """One push of the next version to ``per_push`` random rows; True when it was acknowledged
        (a failed push was never acknowledged, and leaves nothing to count)."""
        self.version += 1
        pick = np.sort(self._gen.choice(len(self.ids), size=self.per_push, replace=False))
        values = np.full((self.per_push, TABLE.dim), float(self.version), dtype=np.float32)
        try:
            store.push(TABLE.name, self.ids[pick], values, np.zeros(self.per_push, np.float32))
        except KelpError:
            return False
        self.acked[pick] = self.version
        self.pushes_acked += 1
        return True

    @property
    def acked_rows(self) -> int:
        return int(np.count_nonzero(self.acked > 0))

    def lost(self, store: EmbeddingStore, *, retry_s: float = 0.0, pause_s: float = 0.1) -> int:
        """Acknowledged versions ``store`` no longer has; its reads are retried for ``retry_s``
        (a store that is failing over answers again within a bound)."""
        deadline = time.monotonic() + retry_s
        while True:
            try:
                got = store.pull(TABLE.name, self.ids, count=False)
                break
            except KelpError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(pause_s)
        stored = np.where(got.updated_s > 0, got.rows[:, 0], 0.0).astype(np.int64)
        return int(np.count_nonzero((self.acked > 0) & (stored < self.acked)))


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
    versions = VersionedRows(rows, per_push, seed)
    enough = threading.Event()
    stop = threading.Event()

    with _store(server.url, deployment) as store:

        def write() -> None:
            while not stop.is_set():
                if not versions.push(store):
                    return  # the kill: this push is not acknowledged
                if versions.pushes_acked >= min_pushes:
                    enough.set()

        writer = threading.Thread(target=write, name="durability-writer", daemon=True)
        writer.start()
        if not enough.wait(60):
            stop.set()
            raise RuntimeError(f"only {versions.pushes_acked} pushes acknowledged in 60 s")
        server.kill()  # SIGKILL while the writer is mid-stream
        stop.set()
        writer.join(30)
        durability = durability_of(store)
    server.start()  # the same port and data directory: Redis replays its append-only file
    with _store(server.url, deployment) as store:
        lost = versions.lost(store)
    return DurabilityProbe(versions.pushes_acked, versions.acked_rows, lost, durability)
