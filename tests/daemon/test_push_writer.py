"""PushWriter commits offsets only when the store says the pushes covering them are durable.

Real stores (the memory backend, and the hot-row cache over it); the source is
a stand-in that records commits (its Kafka behaviour is tested elsewhere).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.config import HotCacheConfig, TableSpec
from kelp.consumers.batch import SourceRange
from kelp.daemon.ledger import UpdateLedger
from kelp.daemon.outage import OutageGuard, outage_policy
from kelp.daemon.stages import PushWriter
from kelp.store import HotRowCache, MemoryStore
from kelp.store.base import EmbeddingStore
from kelp.trainer.metrics import TrainerMetrics
from kelp.trainer.optim import SparseUpdate


class RecordingSource:
    def __init__(self) -> None:
        self.commits: list[list[int]] = []

    def commit(self, ranges: list[SourceRange]) -> None:
        self.commits.append([r.first_offset for r in ranges])


def _writer(store: EmbeddingStore, source: RecordingSource, *, gated: bool = False) -> PushWriter:
    metrics = TrainerMetrics(CollectorRegistry())
    guard = OutageGuard(1.0, metrics, policy=outage_policy(1.0, sleep=lambda _s: None))
    return PushWriter(
        source,  # type: ignore[arg-type]
        store,
        UpdateLedger(),
        guard=guard,
        metrics=metrics,
        depth=1,
        threaded=False,
        gated=gated,
    )


def _submit(writer: PushWriter, step: int, ids: np.ndarray) -> None:
    batch = SimpleNamespace(sources=[SourceRange("t", 0, step * 10, step * 10 + 9)])
    update = SparseUpdate(
        ids, np.full((len(ids), 2), float(step), np.float32), np.zeros(len(ids), np.float32)
    )
    writer.submit(step, batch, {"t": update})  # type: ignore[arg-type]


def test_write_through_store_commits_every_batch() -> None:
    source = RecordingSource()
    writer = _writer(MemoryStore([TableSpec(name="t", dim=2)]), source)
    for step in (1, 2):
        _submit(writer, step, np.arange(3, dtype=np.uint64))
    assert source.commits == [[10], [20]] and writer.committed_step == 2


@pytest.mark.parametrize("every", [1, 3])
def test_hot_cache_commits_only_after_its_write_back(every: int) -> None:
    inner = MemoryStore([TableSpec(name="t", dim=2)])
    cfg = HotCacheConfig(enabled=True, min_count=1, writeback_every_steps=every, writeback_interval_s=1e9)
    cache = HotRowCache(inner, cfg)
    ids = np.arange(3, dtype=np.uint64)
    cache.pull("t", ids)  # the rows are cached, so pushes stay in the cache until a write-back
    source = RecordingSource()
    writer = _writer(cache, source)
    for step in range(1, 6):
        _submit(writer, step, ids)
        written = inner.pull("t", ids, count=False).rows[0, 0]
        if step % every == 0:
            assert source.commits[-1] == [10 * s for s in range(step - every + 1, step + 1)]
            assert written == step  # committed offsets cover only rows the inner store holds
        else:
            assert not source.commits or source.commits[-1][-1] < 10 * step
    committed = writer.committed_step
    assert writer.drain(timeout_s=5.0)  # drain forces the write-back, then commits the rest
    assert writer.committed_step == 5 and inner.pull("t", ids, count=False).rows[0, 0] == 5.0
    assert sum(len(c) for c in source.commits) == 5 and (committed == 5) == (5 % every == 0)


def test_hot_tier_commits_each_batch_once_its_own_push_is_durable() -> None:
    """Rows first dirtied by push p are written back at push p + every - 1, so commits lag one step
    here (every=2) instead of waiting for a moment with no dirty row at all (which never comes when
    every step dirties rows)."""
    inner = MemoryStore([TableSpec(name="t", dim=2)])
    cache = HotRowCache(
        inner, HotCacheConfig(enabled=True, min_count=1, writeback_every_steps=2, writeback_interval_s=1e9)
    )
    a, b = np.arange(3, dtype=np.uint64), np.arange(10, 13, dtype=np.uint64)
    cache.pull_many({"t": np.concatenate([a, b])})
    source = RecordingSource()
    writer = _writer(cache, source)
    for step in range(1, 6):
        _submit(writer, step, a if step % 2 else b)
        assert cache.dirty_rows() > 0  # never "all durable" between steps
        assert source.commits[-1:] == ([[10 * (step - 1)]] if step > 1 else [])
    assert writer.drain(timeout_s=5.0) and source.commits[-1] == [50]


def test_an_idle_writer_still_commits_after_the_time_bound() -> None:
    inner = MemoryStore([TableSpec(name="t", dim=2)])
    cache = HotRowCache(
        inner,
        HotCacheConfig(enabled=True, min_count=1, writeback_every_steps=1000, writeback_interval_s=0.05),
    )
    ids = np.arange(3, dtype=np.uint64)
    cache.pull("t", ids)
    source = RecordingSource()
    metrics = TrainerMetrics(CollectorRegistry())
    guard = OutageGuard(1.0, metrics, policy=outage_policy(1.0, sleep=lambda _s: None))
    writer = PushWriter(
        source, cache, UpdateLedger(), guard=guard, metrics=metrics, depth=1, idle_flush_s=0.02
    )  # type: ignore[arg-type]
    writer.start()
    _submit(writer, 1, ids)
    deadline = time.monotonic() + 5.0
    while not source.commits and time.monotonic() < deadline:
        time.sleep(0.01)
    assert source.commits == [[10]] and cache.dirty_rows() == 0  # no second batch was needed
    assert writer.drain(timeout_s=5.0)


def test_a_gated_writer_commits_a_durable_step_only_once_the_gate_reaches_it() -> None:
    """A trainer group's row owners push some of this rank's updates: its offsets wait for the group."""
    source = RecordingSource()
    writer = _writer(MemoryStore([TableSpec(name="t", dim=2)]), source, gated=True)
    for step in (1, 2, 3):
        _submit(writer, step, np.arange(3, dtype=np.uint64))
    assert writer.durable_step == 3 and source.commits == [] and writer.committed_step == 0
    writer.open_gate(2)
    assert source.commits == [[10, 20]] and writer.committed_step == 2
    writer.submit(4, None, {})  # a step this rank trained no batch in: nothing to commit for it
    writer.open_gate(4)
    assert source.commits == [[10, 20], [30]] and writer.committed_step == 4
