"""Taking a snapshot's rows: every row once, and a paced scan that asks to wait for its pace."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from kelp.config import TableSpec
from kelp.store.memory import MemoryStore
from kelp.store.snapshots import take
from kelp.store.snapshots.catalog import read_shard
from kelp.store.snapshots.storage import open_storage


def _store(n: int) -> MemoryStore:
    store = MemoryStore([TableSpec(name="ads", dim=4)])
    ids = np.arange(1, n + 1, dtype=np.uint64)
    store.push("ads", ids, np.tile(ids[:, None].astype(np.float32), (1, 4)), np.ones(n, np.float32))
    return store


def test_a_paced_snapshot_writes_the_same_rows(tmp_path) -> None:  # type: ignore[no-untyped-def]
    storage = open_storage(str(tmp_path))
    with _store(1000) as store:
        entries = take.take_rows(
            store,
            storage,
            "d",
            snapshot_id="s1",
            tables={"ads": {"dim": 4, "dtype": "float32"}},
            updated_since_s=None,
            shard_rows=300,
            max_rows_per_s=1e9,
        )
    ids = np.concatenate([read_shard(storage, e).ids for e in entries])
    assert sorted(ids.tolist()) == list(range(1, 1001))
    with pytest.raises(ValueError, match="max_rows_per_s"):
        take.take_rows(
            store, storage, "d", snapshot_id="s2", tables={}, updated_since_s=None, max_rows_per_s=0
        )


class _Waits(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.asked.append(timeout)
        return False


def test_the_pace_asks_to_wait_until_the_rows_read_fit_the_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(take.time, "monotonic", lambda: now[0])
    stop = _Waits()
    writer = take._PartWriter(
        None,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        deployment="d",
        snapshot_id="s",
        part=0,
        shard_rows=10,
        updated_since_s=None,
        stop=stop,
        rows_per_s=1000.0,
    )
    writer._started = now[0]
    writer._pace(500)  # 500 rows at 1000/s: half a second ahead of the clock
    now[0] += 0.2
    writer._pace(100)  # 600 rows due at 0.6 s, 0.2 s gone
    now[0] += 5.0
    writer._pace(100)  # behind the pace: no wait
    assert stop.asked == pytest.approx([0.5, 0.4])
