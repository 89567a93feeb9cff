"""The trainer daemon in-process, on real Tansu and real redis-server: training, exactness, outages."""

from __future__ import annotations

import math
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import torch

from kelp.config import KelpConfig, StoreConfig
from kelp.daemon.outage import StoreOutageError
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker, RedisServer
from kelp.store.factory import build_store

from .conftest import CRITEO, CRITEO_ROWS, Running, base_config, group_offsets, on_kafka, wait_for

pytestmark = pytest.mark.integration


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _stored_rows(url: str, deployment: str, table: str) -> dict[int, bytes]:
    """Every stored row of a table, read straight from Redis in either row layout (store/redis/keys.py)."""
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"k1:{deployment}:{table}:r:*", count=10_000))
        values = client.mget(keys) if keys else []
        rows = {int.from_bytes(k[-8:], "big"): v for k, v in zip(keys, values, strict=True)}
        for bucket in client.scan_iter(match=f"k2:{deployment}:{table}:h:*", count=10_000):
            rows.update({int.from_bytes(f, "big"): v for f, v in client.hgetall(bucket).items()})
        return rows
    finally:
        client.close()


def _batch_ids_recorder() -> tuple[Callable[..., None], dict[str, list[np.ndarray]]]:
    seen: dict[str, list[np.ndarray]] = {}

    def on_step(_step: int, batch: Any, _result: Any) -> None:
        for table, ids in batch.tables.items():
            seen.setdefault(table, []).append(ids.unique_ids[ids.inverse])  # every occurrence

    return on_step, seen


def test_trains_from_kafka_into_redis_and_reports(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str, redis_url: str
) -> None:
    cfg = on_kafka(base_config(tmp_path), kafka_broker, criteo_topic, redis_url)
    on_step, seen = _batch_ids_recorder()
    daemon = TrainDaemon(cfg, on_step=on_step)
    running = Running(daemon)
    wait_for(lambda: daemon.report.samples >= CRITEO_ROWS, 120, "all samples trained")

    port = cfg.metrics.port
    assert _get(port, "/healthz")[0] == 200
    assert _get(port, "/readyz") == (200, "ready\n")
    status, metrics = _get(port, "/metrics")
    assert status == 200
    for name in ("kelp_trainer_steps_total", "kelp_consumer_samples_total", "kelp_store_rows_pulled_total"):
        assert name in metrics
    assert _get(port, "/nope")[0] == 404

    report = running.stop()
    assert report.samples == CRITEO_ROWS
    assert report.stopped_by == "test"
    quarter = max(1, len(report.losses) // 4)
    assert np.mean(report.losses[-quarter:]) < np.mean(report.losses[:quarter])
    assert math.isfinite(report.auc) and 0.0 < report.auc < 1.0
    assert report.checkpoint is not None and Path(report.checkpoint).is_file()
    # One sample per record from offset 0: the committed offsets add up to every record.
    assert sum(group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)) == CRITEO_ROWS
    assert set(report.stage_seconds) >= {"fetch", "pull", "forward_backward", "push", "commit"}

    # min_count=2 counting occurrences: an id gets a row once it occurred twice, in one batch or two.
    for table, parts in seen.items():
        ids, counts = np.unique(np.concatenate(parts), return_counts=True)
        assert set(_stored_rows(redis_url, cfg.deployment, table)) == set(ids[counts >= 2].tolist()), table


def _file_config(tmp_path: Path, url: str, deployment: str, **trainer: Any) -> KelpConfig:
    cfg = base_config(tmp_path / deployment, **trainer)
    cfg.deployment = deployment
    cfg.store = StoreConfig(backend="redis", urls=[url])
    return cfg


@pytest.mark.parametrize("hot_cache", [False, True], ids=["write-through", "working-copy"])
def test_prefetch_and_write_behind_lose_no_update(tmp_path: Path, redis_url: str, hot_cache: bool) -> None:
    """Prefetched pulls miss the previous batch's push; the overlay makes them exact anyway. With the
    working copy the prefetch reserves rows that earlier steps then update; the gather sees them."""
    finals: dict[str, dict[str, dict[int, bytes]]] = {}
    tables = [f"C{i}" for i in range(1, 27)]
    for deployment, prefetch in (("sequential", 0), ("pipelined", 3)):
        cfg = _file_config(tmp_path, redis_url, deployment, prefetch_batches=prefetch, push_queue_batches=3)
        cfg.batching.batch_size = 128
        cfg.metrics.enabled = False
        cfg.store.hot_cache.enabled = hot_cache
        cfg.store.hot_cache.writeback_every_steps = 4
        torch.manual_seed(0)
        daemon = TrainDaemon(cfg)
        report = daemon.run()
        assert report.samples == CRITEO_ROWS and report.stopped_by == "source exhausted"
        assert daemon.pipeline is not None
        working = daemon.pipeline.working_copy
        assert (working is not None) == hot_cache
        if prefetch:
            patched = daemon.pipeline.ledger.patched_rows
            overlapped = working.overlapped_rows if working is not None else patched
            assert overlapped > 0, "prefetch never overlapped a step's update: the test proves nothing"
        finals[deployment] = {t: _stored_rows(redis_url, deployment, t) for t in tables}

    for table in tables:
        seq, pipe = finals["sequential"][table], finals["pipelined"][table]
        assert seq.keys() == pipe.keys(), table
        ids = np.array(sorted(seq), dtype=np.uint64)
        with (
            build_store(
                StoreConfig(backend="redis", urls=[redis_url]), list(cfg.features.tables), "sequential"
            ) as a,
            build_store(
                StoreConfig(backend="redis", urls=[redis_url]), list(cfg.features.tables), "pipelined"
            ) as b,
        ):
            ra, rb = a.pull(table, ids, count=False), b.pull(table, ids, count=False)
        np.testing.assert_allclose(ra.rows, rb.rows, rtol=1e-5, atol=1e-6, err_msg=table)
        np.testing.assert_allclose(ra.state, rb.state, rtol=1e-5, atol=1e-6, err_msg=table)


def test_store_outage_is_retried_without_committing(
    tmp_path: Path, kafka_broker: KafkaBroker, criteo_topic: str
) -> None:
    with RedisServer(persistence=True) as server:
        cfg = on_kafka(base_config(tmp_path, max_store_outage_s=60.0), kafka_broker, criteo_topic, server.url)
        cfg.batching.batch_size = 64
        killed = threading.Event()

        def kill_at_step_3(step: int, _batch: Any, _result: Any) -> None:
            if step == 3 and not killed.is_set():
                server.kill()
                killed.set()

        daemon = TrainDaemon(cfg, on_step=kill_at_step_3)
        running = Running(daemon)
        wait_for(killed.is_set, 120, "step 3")
        wait_for(lambda: not daemon.readiness()[0], 10, "readiness to report the outage")
        assert daemon.readiness() == (False, "store unavailable, retrying")
        committed_during = group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)
        steps_during = daemon.report.steps
        threading.Event().wait(2.0)
        assert group_offsets(kafka_broker, cfg.source.group_id, criteo_topic) == committed_during
        assert sum(committed_during) < CRITEO_ROWS
        retried = daemon.registry.get_sample_value(
            "kelp_trainer_errors_total", {"stage": "push", "kind": "retried"}
        ) or daemon.registry.get_sample_value(
            "kelp_trainer_errors_total", {"stage": "pull", "kind": "retried"}
        )
        assert retried and retried > 0

        server.restart()
        wait_for(lambda: daemon.report.samples >= CRITEO_ROWS, 120, "training to finish after the outage")
        assert daemon.report.steps > steps_during
        wait_for(lambda: daemon.readiness()[0], 10, "readiness to recover")
        running.stop()
        assert sum(group_offsets(kafka_broker, cfg.source.group_id, criteo_topic)) == CRITEO_ROWS


def test_store_down_past_the_budget_is_fatal_not_a_hang(tmp_path: Path) -> None:
    with RedisServer() as server:
        cfg = _file_config(tmp_path, server.url, "fatal", max_store_outage_s=1.0)
        cfg.store.retry.attempts = 1
        cfg.store.socket_timeout_s = 0.5
        cfg.store.connect_timeout_s = 0.5
        cfg.batching.batch_size = 64

        def kill_at_step_2(step: int, _batch: Any, _result: Any) -> None:
            if step == 2:
                server.kill()

        daemon = TrainDaemon(cfg, on_step=kill_at_step_2)
        with pytest.raises(StoreOutageError, match=r"store unreachable for .*max_store_outage_s=1\b"):
            daemon.run()
        assert daemon.readiness()[0] is False
        assert daemon.registry.get_sample_value("kelp_trainer_ready") == 0


def test_publishes_snapshots_while_training_and_on_drain(tmp_path: Path, redis_url: str) -> None:
    from kelp.publish import build_channel, load_model

    cfg = _file_config(tmp_path, redis_url, "publishing")
    cfg.metrics.enabled = False
    cfg.batching.batch_size = 128
    cfg.publisher.enabled = True
    cfg.publisher.channel = "redis"
    cfg.publisher.interval_s = 0.01
    cfg.publisher.keep_versions = 3
    daemon = TrainDaemon(cfg)
    report = daemon.run()

    published = daemon.registry.get_sample_value("kelp_publisher_snapshots_total", {"result": "ok"})
    assert published is not None and published >= 2  # the first step, at least one more, and the drain
    with build_channel(cfg.publisher, cfg.store, cfg.deployment) as channel:
        assert channel.latest_version() == report.published_version
        assert len(channel.versions()) == 3  # keep_versions prunes the rest
        snapshot = channel.read(report.published_version)
    # The drain's snapshot holds the final weights and says which records they have seen.
    assert snapshot.manifest.step == report.steps
    assert snapshot.manifest.offsets == {(str(CRITEO), 0): CRITEO_ROWS}
    served = load_model(snapshot, cfg.features)
    for name, tensor in daemon.step.model.state_dict().items():
        assert torch.equal(served.state_dict()[name].cpu(), tensor.cpu()), name


def test_in_store_adagrad_trains_like_whole_row_pushes(tmp_path: Path, redis_url: str) -> None:
    """One trainer: ``sparse_updates: compose`` (Redis applies the step) stores what ``overwrite`` stores."""
    tables = ["C1", "C2", "C3"]
    stored: dict[str, dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for updates in ("overwrite", "compose"):
        deployment = f"rowwise-{updates}-{uuid.uuid4().hex[:8]}"
        cfg = _file_config(tmp_path, redis_url, deployment, prefetch_batches=0)
        cfg.store.sparse_updates = updates
        cfg.batching.batch_size = 256
        cfg.metrics.enabled = False
        torch.manual_seed(0)
        assert TrainDaemon(cfg).run().samples == CRITEO_ROWS
        with build_store(cfg.store, list(cfg.features.tables), cfg.deployment) as store:
            stored[updates] = {}
            for t in tables:
                ids = np.array(sorted(_stored_rows(redis_url, cfg.deployment, t)), dtype=np.uint64)
                got = store.pull(t, ids, count=False)
                stored[updates][t] = (ids, got.rows, got.state)
    for t in tables:
        (ids_o, rows_o, state_o), (ids_c, rows_c, state_c) = stored["overwrite"][t], stored["compose"][t]
        assert np.array_equal(ids_o, ids_c), t
        # The same steps, in double precision inside Redis vs float32 in torch.
        np.testing.assert_allclose(rows_c, rows_o, rtol=1e-4, atol=1e-5, err_msg=t)
        np.testing.assert_allclose(state_c, state_o, rtol=1e-4, atol=1e-6, err_msg=t)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_the_pull_plan_is_worked_out_once_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, prefetch: int
) -> None:
    """The prefetcher's plan (unique ids plus fallback buckets) is the one the step trains on."""
    from kelp.store.policy.fallback import Fallback

    cfg = base_config(tmp_path, prefetch_batches=prefetch)
    cfg.metrics.enabled = False
    for table in cfg.features.tables:
        table.admission.fallback_buckets = 8  # so a plan holds more than the batch's own ids
    expanded: list[int] = []
    expand = Fallback.expand

    def counted(self: Fallback, ids_by_table: Any) -> Any:
        expanded.append(1)
        return expand(self, ids_by_table)

    monkeypatch.setattr(Fallback, "expand", counted)
    report = TrainDaemon(cfg, http=False, publish=False).run()
    assert report.samples == CRITEO_ROWS and report.steps > 1
    assert len(expanded) == report.steps
