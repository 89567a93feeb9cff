"""Row snapshots on real services: take, restore after FLUSHALL, incrementals, the group's offsets, dense.

Standalone Redis with Kafka for the full round trip (rows, offsets, dense
version, trainer checkpoint, and the two refusals), Redis Cluster with a file
source for incrementals (several scan parts, no offsets), and the keep rule on
a directory alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import yaml
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from torch import nn

from kelp.config import KelpConfig, parse_config
from kelp.daemon.group_offsets import active_members, committed_offsets
from kelp.daemon.row_snapshots import (
    prune_snapshots,
    restore_in_progress,
    restore_snapshot,
    take_snapshot,
)
from kelp.harness import KafkaBroker
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.snapshot import build_snapshot
from kelp.store import build_store
from kelp.store.base import EmbeddingStore
from kelp.store.rows.stored import StoredRows
from kelp.store.snapshots.catalog import (
    incomplete_snapshots,
    list_snapshots,
    object_name,
    read_shard,
    write_manifest,
)
from kelp.store.snapshots.errors import SnapshotError
from kelp.store.snapshots.manifest import MANIFEST_FORMAT_VERSION, SnapshotManifest, new_snapshot_id
from kelp.store.snapshots.storage import open_storage
from kelp.trainer import build_model
from kelp.trainer.checkpoint import read_checkpoint, save_checkpoint

pytestmark = pytest.mark.integration

FIELDS = ("ids", "rows", "state", "access_count", "updated_s")


def _config(tmp_path: Path, store: dict[str, Any], source: dict[str, Any], **extra: Any) -> KelpConfig:
    doc = {
        "deployment": f"snap-{time.monotonic_ns() % 10**9}",
        "source": source,
        "store": store,
        "publisher": {"channel": "filesystem", "path": str(tmp_path / "channel")},
        "snapshots": {"rows": {"url": str(tmp_path / "snapshots")}},
        "trainer": {"checkpoint_dir": str(tmp_path / "checkpoints")},
        "features": {
            "dense": [{"name": "i1"}],
            "sparse": [{"name": "ads"}, {"name": "users"}],
            "tables": [{"name": "ads", "dim": 4}, {"name": "users", "dim": 3}],
        },
        **extra,
    }
    return parse_config(yaml.safe_load(yaml.safe_dump(doc)))


def _file_source(tmp_path: Path) -> dict[str, Any]:
    return {"kind": "file", "path": str(tmp_path / "x.tsv"), "format": "criteo_tsv"}


def _store(cfg: KelpConfig) -> EmbeddingStore:
    return build_store(cfg.store, cfg.features.store_tables(), cfg.deployment)


def _push(store: EmbeddingStore, ids: np.ndarray, seed: int) -> None:
    rng = np.random.default_rng(seed)
    updates = {}
    for name, table in store.tables.items():
        rows = rng.standard_normal((len(ids), table.dim)).astype(np.float32)
        updates[name] = (ids, rows, rng.random(len(ids)).astype(np.float32))
    store.push_many(updates)


def _all_rows(store: EmbeddingStore) -> dict[str, dict[str, np.ndarray]]:
    """Every stored row of every table, each field sorted by id (duplicates of a rehashing SCAN removed)."""
    out = {}
    for name in store.tables:
        blocks = [b for part in range(store.row_scan_parts()) for b in store.scan_rows(name, part)]
        fields = {f: np.concatenate([getattr(b, f) for b in blocks]) for f in FIELDS}
        _, first = np.unique(fields["ids"], return_index=True)
        out[name] = {f: v[first] for f, v in fields.items()}
    return out


def _assert_same_rows(got: dict[str, dict[str, np.ndarray]], want: dict[str, dict[str, np.ndarray]]) -> None:
    assert got.keys() == want.keys()
    for table in want:
        for f in FIELDS:
            np.testing.assert_array_equal(got[table][f], want[table][f], err_msg=f"{table}.{f}")


def _commit(broker: KafkaBroker, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        tps = {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        consumer.assign(list(tps))
        consumer.commit(tps)
    finally:
        consumer.close(autocommit=False)


def _wait(what: str, ready: Any, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_full_snapshot_restores_rows_offsets_dense_and_checkpoint(
    tmp_path: Path, redis_url: str, kafka_broker: KafkaBroker, unique_topic: str
) -> None:
    kafka_broker.create_topic(unique_topic, partitions=2)
    group = f"g-{unique_topic}"
    source = {"kind": "kafka", "bootstrap_servers": [kafka_broker.bootstrap], "topics": [unique_topic]}
    cfg = _config(tmp_path, {"backend": "redis", "urls": [redis_url]}, {**source, "group_id": group})
    _commit(kafka_broker, group, unique_topic, {0: 5, 1: 7})
    channel = FilesystemChannel(tmp_path / "channel")
    model = build_model(cfg.features, cfg.trainer)
    published = build_snapshot(
        model, cfg.features, cfg.trainer, version=channel.next_version(), step=3, offsets={}
    )
    channel.write(published)
    ckpt = save_checkpoint(tmp_path / "trainer", nn.Linear(2, 1), None, step=42, config_hash="h")
    ids = np.arange(1, 301, dtype=np.uint64)
    with _store(cfg) as store:
        _push(store, ids, seed=1)
        before = _all_rows(store)

        manifest = take_snapshot(cfg, checkpoint_path=ckpt)

        assert manifest.kind == "full" and manifest.total_rows == 600
        assert manifest.group_id == group and manifest.consistency["rule"] == "rows-at-or-after-offsets"
        assert manifest.offsets == [
            {"topic": unique_topic, "partition": 0, "offset": 5},
            {"topic": unique_topic, "partition": 1, "offset": 7},
        ]
        storage = open_storage(str(tmp_path / "snapshots"))
        assert manifest.dense is not None and (manifest.dense["version"], manifest.dense["step"]) == (1, 3)
        assert storage.get(manifest.dense["file"]) == published.weights
        assert storage.get(manifest.dense["manifest"]) == published.manifest.to_json()

        # training goes on: rows change, the group commits further
        _push(store, ids[:10], seed=2)
        _commit(kafka_broker, group, unique_topic, {0: 50, 1: 70})
        changed = _all_rows(store)
        with pytest.raises(SnapshotError, match="already holds rows of ads, users"):
            restore_snapshot(cfg, manifest.snapshot_id, replace=False)
        member = KafkaConsumer(
            unique_topic, bootstrap_servers=kafka_broker.bootstrap, group_id=group, enable_auto_commit=False
        )
        try:
            _wait("the consumer to join", lambda: member.poll(200) is not None and bool(member.assignment()))
            with pytest.raises(SnapshotError, match=f"consumer group '{group}' has 1 active member"):
                restore_snapshot(cfg, "latest", replace=True)
        finally:
            member.close(autocommit=False)
        _assert_same_rows(_all_rows(store), changed)  # a refused restore wrote nothing
        _wait("the group to empty", lambda: active_members(cfg.source) == 0)

        redis.Redis.from_url(redis_url).flushall()
        report = restore_snapshot(cfg, "latest", replace=False, checkpoint_dir=tmp_path / "restored")

        _assert_same_rows(_all_rows(store), before)
    assert report.rows == {"ads": 300, "users": 300} and report.interrupted is None
    assert committed_offsets(cfg.source) == manifest.offsets
    assert restore_in_progress(cfg) is None
    _, meta = read_checkpoint(report.checkpoint)
    assert meta["step"] == 42 and (tmp_path / "restored" / "latest").read_text().count("ckpt-000000000042")


def test_incremental_takes_only_rows_updated_since_its_parent(
    tmp_path: Path, clean_redis_cluster: Any
) -> None:
    cfg = _config(
        tmp_path,
        {"backend": "redis-cluster", "urls": clean_redis_cluster.urls},
        _file_source(tmp_path),
        publisher={"enabled": False},
    )
    with pytest.raises(SnapshotError, match="no full snapshot to build on"):
        take_snapshot(cfg, incremental=True)
    old = np.arange(1, 201, dtype=np.uint64)
    hour_ago = int(time.time()) - 3600
    with _store(cfg) as store:
        assert store.row_scan_parts() > 1
        rng = np.random.default_rng(3)
        for name, table in store.tables.items():
            store.load_rows(
                name,
                StoredRows(
                    ids=old,
                    rows=rng.standard_normal((len(old), table.dim)).astype(np.float32),
                    state=rng.random(len(old)).astype(np.float32),
                    access_count=np.full(len(old), 4, np.uint32),
                    updated_s=np.full(len(old), hour_ago, np.uint32),
                ),
            )
        full = take_snapshot(cfg)
        assert (full.total_rows, full.offsets, full.group_id, full.dense) == (400, [], None, None)

        fresh = np.arange(1000, 1050, dtype=np.uint64)
        _push(store, np.concatenate([old[:10], fresh]), seed=4)
        inc = take_snapshot(cfg, incremental=True)

        assert (inc.kind, inc.parent) == ("incremental", full.snapshot_id)
        assert inc.updated_since_s == int(full.created_at) - 1
        storage = open_storage(str(tmp_path / "snapshots"))
        taken = {t: set() for t in store.tables}
        for entry in inc.shards:
            taken[entry.table] |= set(read_shard(storage, entry).ids.tolist())
        want = set(old[:10].tolist()) | set(fresh.tolist())
        assert taken == {"ads": want, "users": want}
        before = _all_rows(store)

        for server in clean_redis_cluster.servers:
            server.client().flushall()
        report = restore_snapshot(cfg, "latest", replace=False)

        assert report.chain == [full.snapshot_id, inc.snapshot_id]
        _assert_same_rows(_all_rows(store), before)


def test_prune_keeps_the_newest_full_snapshots_with_their_incrementals(tmp_path: Path) -> None:
    cfg = _config(
        tmp_path,
        {"backend": "memory"},
        _file_source(tmp_path),
        snapshots={"rows": {"url": str(tmp_path / "snapshots"), "keep": 2}},
    )
    storage = open_storage(str(tmp_path / "snapshots"))
    now = time.time()
    made: list[str] = []
    for k, kind in enumerate(["full", "incremental", "full", "full", "incremental"]):
        sid = new_snapshot_id(now - 600 + k)
        parent = made[-1] if kind == "incremental" else None
        write_manifest(
            storage,
            SnapshotManifest(
                MANIFEST_FORMAT_VERSION, sid, cfg.deployment, kind, parent, now, now, None, {}, []
            ),
        )
        made.append(sid)
    killed_long_ago = new_snapshot_id(now - 7200)
    killed_now = new_snapshot_id(now)
    for sid in (killed_long_ago, killed_now):
        storage.put(object_name(cfg.deployment, sid, "shards/ads.0.0.safetensors"), b"partial")

    deleted = prune_snapshots(cfg, storage, now=now)

    assert sorted(deleted) == sorted([made[0], made[1], killed_long_ago])
    assert [m.snapshot_id for m in list_snapshots(storage, cfg.deployment)] == made[2:]
    assert incomplete_snapshots(storage, cfg.deployment) == [killed_now]
