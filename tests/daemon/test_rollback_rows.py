"""``kelp model rollback --rows`` after a poisoned stretch, and start-up refused mid-restore.

Real Redis (rows and the publish channel) and Kafka: train, snapshot, train on
flipped labels, roll back; a live replica then scores exactly as a replica
built only from the snapshot's rows and dense weights does.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch
from prometheus_client import CollectorRegistry
from safetensors.torch import load as st_load

from kelp.cli.main import main
from kelp.config import KelpConfig, StoreConfig
from kelp.consumers.produce import file_messages, produce
from kelp.daemon.row_snapshots import marker_key
from kelp.daemon.startup import RestoreInProgressError, check_endpoints
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker
from kelp.publish.fs_channel import FilesystemChannel
from kelp.publish.snapshot import verify_snapshot
from kelp.serving.replica import ServingReplica
from kelp.store.factory import build_store
from kelp.store.snapshots.catalog import chain, list_snapshots, read_shard
from kelp.store.snapshots.storage import open_storage
from kelp.trainer import build_model
from kelp.trainer.checkpoint import load_latest

from .conftest import (
    CRITEO,
    PARTITIONS,
    Running,
    base_config,
    group_offsets,
    on_kafka,
    wait_for,
    write_config,
)

HALF = 1000


def _produce(broker: KafkaBroker, topic: str, path: Path) -> None:
    produce({"bootstrap_servers": broker.bootstrap}, topic, file_messages(path, "criteo_tsv", 1), quiet=True)


def _halves(tmp_path: Path) -> tuple[Path, Path]:
    """The fixture's first half, and its second half with every label flipped (the poisoned stretch)."""
    lines = CRITEO.read_text().splitlines(keepends=True)
    clean, poisoned = tmp_path / "clean.tsv", tmp_path / "poisoned.tsv"
    clean.write_text("".join(lines[:HALF]))
    flipped = [("1" if line[0] == "0" else "0") + line[1:] for line in lines[HALF : 2 * HALF]]
    poisoned.write_text("".join(flipped))
    return clean, poisoned


def _train_until(cfg: KelpConfig, broker: KafkaBroker, topic: str, total: int, **kwargs: Any) -> None:
    running = Running(TrainDaemon(cfg, http=False, **kwargs))
    group = cfg.source.group_id  # type: ignore[union-attr]
    wait_for(lambda: sum(group_offsets(broker, group, topic)) >= total, 120, f"{total} records committed")
    running.stop()


def _wait_serving(replica: ServingReplica, version: int) -> None:
    wait_for(
        lambda: replica.slot.current is not None and replica.slot.current.version == version,
        60,
        f"the replica serving v{version}",
    )


def _snapshot_replica(cfg: KelpConfig, tmp_path: Path, snapshot_id: str) -> ServingReplica:
    """A replica holding only what the snapshot holds: its rows in a memory store, its dense weights."""
    assert cfg.snapshots.rows.url is not None
    storage = open_storage(cfg.snapshots.rows.url)
    store = build_store(StoreConfig(backend="memory"), cfg.features.store_tables(), cfg.deployment)
    for manifest in chain(storage, cfg.deployment, snapshot_id):
        for shard in manifest.shards:
            store.load_rows(shard.table, read_shard(storage, shard))
    dense = chain(storage, cfg.deployment, snapshot_id)[-1].dense
    assert dense is not None
    channel = FilesystemChannel(tmp_path / "snapshot-dense")
    channel.write(verify_snapshot(storage.get(dense["manifest"]), storage.get(dense["file"])))
    replica = ServingReplica(cfg, CollectorRegistry(), store=store, channel=channel)
    replica.start()
    _wait_serving(replica, dense["version"])
    return replica


def test_rollback_rows_serves_the_snapshots_model_after_a_poisoned_stretch(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topic = f"poison-{time.monotonic_ns()}"
    kafka_broker.create_topic(topic, partitions=PARTITIONS)
    clean, poisoned = _halves(tmp_path)
    cfg = on_kafka(base_config(tmp_path), kafka_broker, topic, redis_url)
    cfg.batching.batch_size = 64
    cfg.publisher.enabled = True
    cfg.publisher.channel = "redis"  # in the test's Redis, not the example's shared directory
    cfg.publisher.path = None
    cfg.publisher.interval_s = 0.2
    cfg.publisher.keep_versions = 1  # the snapshot's version is pruned: rollback re-publishes its copy
    cfg.snapshots.rows.url = str(tmp_path / "snaps")
    config = write_config(cfg, tmp_path / "kelp.yaml")

    _produce(kafka_broker, topic, clean)
    _train_until(cfg, kafka_broker, topic, HALF)
    assert main(["store", "snapshot", "--config", str(config)]) == 0
    (snap,) = list_snapshots(open_storage(cfg.snapshots.rows.url), cfg.deployment)
    assert snap.dense is not None

    batches: list[Any] = []
    _produce(kafka_broker, topic, poisoned)
    _train_until(cfg, kafka_broker, topic, 2 * HALF, on_step=lambda _s, batch, _r: batches.append(batch))
    probe = batches[-1]

    replica = ServingReplica(cfg, CollectorRegistry())
    replica.start()
    expected = _snapshot_replica(cfg, tmp_path, snap.snapshot_id)
    try:
        wait_for(lambda: replica.slot.current is not None, 60, "a model loaded")
        poisoned_scores = np.array(replica.scorer.score(probe).scores)
        capsys.readouterr()
        assert main(["model", "rollback", "--config", str(config), "--rows"]) == 0
        out = capsys.readouterr().out
        assert f"row snapshot {snap.snapshot_id}" in out and "re-published as v" in out
        pinned = replica.channel.pinned_version()
        assert pinned is not None and pinned > snap.dense["version"]
        _wait_serving(replica, pinned)
        served = np.array(replica.scorer.score(probe).scores)
        wanted = np.array(expected.scorer.score(probe).scores)
    finally:
        replica.close()
        expected.close()
    np.testing.assert_allclose(served, wanted, rtol=0, atol=1e-6)
    assert not np.allclose(served, poisoned_scores, atol=1e-4)  # the rollback changed what is served

    # Restarted trainers resume the snapshot's dense weights, not the poisoned ones.
    model = build_model(cfg.features, cfg.trainer)
    resumed = load_latest(cfg.trainer.checkpoint_dir, model)
    assert resumed is not None and resumed.step == snap.dense["step"]
    weights = st_load(open_storage(cfg.snapshots.rows.url).get(snap.dense["file"]))
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name


def test_trainer_and_replica_refuse_to_start_mid_restore(tmp_path: Path, redis_url: str) -> None:
    cfg = base_config(tmp_path)
    cfg.store = StoreConfig(backend="redis", urls=[redis_url])
    marker = {"snapshot_id": "20261129T120000.000Z-ab12", "started_at": time.time(), "host": "h", "pid": 1}
    redis.Redis.from_url(redis_url).set(marker_key(cfg.deployment), json.dumps(marker))
    for role in ("train", "serve"):
        with pytest.raises(RestoreInProgressError) as refused:
            check_endpoints(cfg, role)  # type: ignore[arg-type]
        message = str(refused.value)
        assert f"kelp {role} refused" in message
        assert "--snapshot 20261129T120000.000Z-ab12 --replace" in message
        assert "\n" not in message
    redis.Redis.from_url(redis_url).delete(marker_key(cfg.deployment))
    check_endpoints(cfg, "train")  # no restore running: starts
