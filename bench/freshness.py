"""``kelp bench freshness``: seconds from producing a record to serving what was learned from it.

Starts a broker (Apache Kafka by default, ``--broker tansu`` for Tansu) and
redis-server, then runs together, in one process:

* a producer sending criteo-synth at a steady rate, in messages of
  ``PER_MESSAGE`` samples every ``1/messages-per-second``; the first sample
  of each message carries a *probe*: a fresh id in table C1 that no other
  sample uses, and the send time is recorded with the record's offset;
* the ``kelp train`` daemon (:class:`~kelp.daemon.train.TrainDaemon`, default
  pipeline) publishing dense snapshots to Redis every ``PUBLISH_INTERVAL_S``;
* a serving replica (:class:`~kelp.serving.replica.ServingReplica`) on the
  same store and channel.

The trainer runs the default config, so the hot tier is on. Measured per probe:

* **sparse lag**: produce -> the probe's row is readable through the
  replica's store (``pull(count=False)`` reports a stored row, i.e. the
  trainer's push landed). A probe is a first sighting, which the tier
  writes through. Polled every 10 ms;
* **sparse update lag**: each probe id comes back ``REPEAT_AFTER_S`` later
  in a second sample. By then the id has been seen twice, so the tier keeps
  its row and holds the update until its next write-back. The lag runs from
  producing that second sample until the stored row differs from the value
  its first landing left. This is how late serving sees a hot row's update;
* **dense lag**: produce -> the replica serves a snapshot whose source
  offsets cover the probe's record. Polled every 10 ms.

The two sparse lags are measured a second time through a row cache of
``CACHE_TTL_MS`` (``serving.local_cache_ttl_ms``; ``*_cached``), polled the
same way: what the cache's TTL adds to them, on a replica that is asked for
the same ids again and again.

Floor context: the trainer batches up to ``BATCH`` samples or
``MAX_BATCH_DELAY_MS``, so some of the lag is batching by design.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.bench.runner import progress
from kelp.bench.synth import CriteoSynth
from kelp.bench.train import stream_config
from kelp.config import KelpConfig
from kelp.consumers.codec import encode_columns
from kelp.consumers.criteo import SPARSE_NAMES
from kelp.daemon.train import TrainDaemon
from kelp.harness import RedisServer, make_broker

__all__ = ["run"]

PUBLISH_INTERVAL_S = 2.0
PER_MESSAGE = 100
BATCH = 1024
MAX_BATCH_DELAY_MS = 100
PROBE_BASE = 10**12  # criteo-synth ids are < 10**6: a probe id is never used by anything else
REPEAT_AFTER_S = 1.0  # later than a first landing takes, so the repeat's update is a change to see
CACHE_TTL_MS = 1000  # the row cache of the *_cached lags, as kelp bench serve's cached run


class _Probes:
    """Send time and offset of every probe; the first time each became visible."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent: dict[int, float] = {}
        self.offset: dict[int, int] = {}
        self.sparse_seen: dict[int, float] = {}
        self.dense_seen: dict[int, float] = {}
        self.first_row: dict[int, bytes] = {}
        """The stored row a probe's first landing left (what its repeat must change)."""
        self.repeat_sent: dict[int, float] = {}
        self.update_seen: dict[int, float] = {}
        self.sparse_seen_cached: dict[int, float] = {}
        self.update_seen_cached: dict[int, float] = {}


def _produce(bootstrap: str, topic: str, rate: float, stop: threading.Event, probes: _Probes) -> int:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0, acks=1)
    synth = CriteoSynth(seed=1)
    period = PER_MESSAGE / rate
    repeat_after = round(REPEAT_AFTER_S / period)  # messages
    sent = 0
    next_at = time.perf_counter()
    try:
        while not stop.is_set():
            cols = synth.batch(PER_MESSAGE)
            sparse = {name: cols.sparse[:, i].copy() for i, name in enumerate(SPARSE_NAMES)}
            message = sent // PER_MESSAGE
            probe = PROBE_BASE + message
            sparse["C1"][0] = probe
            repeat = PROBE_BASE + message - repeat_after if message >= repeat_after else None
            if repeat is not None:
                sparse["C1"][1] = repeat
            value = encode_columns(cols.label, cols.dense, sparse)
            with probes.lock:
                probes.sent[probe] = time.time()
                if repeat is not None:
                    probes.repeat_sent[repeat] = probes.sent[probe]
            future = producer.send(topic, value, partition=0)
            future.add_callback(lambda md, p=probe: _record_offset(probes, p, md.offset))
            sent += PER_MESSAGE
            next_at += period
            time.sleep(max(0.0, next_at - time.perf_counter()))
        producer.flush()
    finally:
        producer.close()
    return sent


def _poll_rows(
    read: Callable[[dict[str, np.ndarray]], Any],
    table: str,
    probes: _Probes,
    seen: dict[int, float],
    updated: dict[int, float],
    *,
    keep_first_row: bool,
) -> None:
    """One poll of the probe rows through ``read`` (a store's ``read_many`` or a fetcher's ``read``):
    a probe is seen once its row is stored, updated once the row differs from its first landing's
    (which the direct poll keeps, ``keep_first_row``)."""
    with probes.lock:
        sparse_pending = [p for p in probes.sent if p not in seen]
        update_pending = [p for p in probes.repeat_sent if p in probes.first_row and p not in updated]
    now = time.time()
    if sparse_pending:
        ids = np.array(sparse_pending, dtype=np.uint64)
        got = read({table: ids})
        with probes.lock:
            for i in np.flatnonzero(got.admitted[got.span(table)]).tolist():
                probe = int(ids[i])
                seen[probe] = now
                if keep_first_row:
                    probes.first_row[probe] = got.rows[table][i].tobytes()
    if update_pending:
        ids = np.array(update_pending, dtype=np.uint64)
        rows = read({table: ids}).rows[table]
        with probes.lock:
            for i, probe in enumerate(update_pending):
                if rows[i].tobytes() != probes.first_row[probe]:
                    updated[probe] = now


def _record_offset(probes: _Probes, probe: int, offset: int) -> None:
    with probes.lock:
        probes.offset[probe] = offset


def _watch(
    replica: Any, table: str, topic: str, stop: threading.Event, probes: _Probes, *, cached: Any
) -> None:
    """Poll the replica's view: stored probe rows (sparse) and the served snapshot's offsets (dense);
    the probe rows again through ``cached``, a :class:`~kelp.serving.embeddings.RowFetcher` with a TTL."""
    while not stop.wait(0.01):
        _poll_rows(
            cached.read,
            table,
            probes,
            probes.sparse_seen_cached,
            probes.update_seen_cached,
            keep_first_row=False,
        )
        _poll_rows(
            replica.store.read_many,
            table,
            probes,
            probes.sparse_seen,
            probes.update_seen,
            keep_first_row=True,
        )
        with probes.lock:
            dense_pending = [(p, o) for p, o in probes.offset.items() if p not in probes.dense_seen]
        now = time.time()
        served = replica.slot.current
        if served is not None and dense_pending:
            covered = served.manifest.offsets.get((topic, 0), 0)
            with probes.lock:
                for probe, offset in dense_pending:
                    if offset < covered:
                        probes.dense_seen[probe] = now


def _lags(seen: dict[int, float], sent: dict[int, float]) -> np.ndarray:
    return np.array([seen[p] - sent[p] for p in seen], dtype=np.float64)


def _stream_config(
    bootstrap: str, topic: str, redis_url: str, workdir: Any, *, fetch_sessions: bool
) -> KelpConfig:
    cfg = stream_config(bootstrap, topic, redis_url, workdir, hot_cache="auto", fetch_sessions=fetch_sessions)
    cfg.batching.batch_size = BATCH
    cfg.batching.max_batch_delay_ms = MAX_BATCH_DELAY_MS
    cfg.publisher.enabled = True
    cfg.publisher.channel = "redis"
    cfg.publisher.interval_s = PUBLISH_INTERVAL_S
    cfg.serving.poll_interval_s = 1.0
    return cfg


def run(quick: bool, broker: str | None = None) -> dict[str, Any]:
    import tempfile
    from pathlib import Path

    from kelp.serving.embeddings import RowFetcher
    from kelp.serving.metrics import ServingMetrics
    from kelp.serving.replica import ServingReplica

    rate = 2000.0
    duration = 25.0 if quick else 120.0
    probes = _Probes()
    service = make_broker(broker)
    progress(f"starting {service.label} and redis-server")
    with service, RedisServer() as redis_srv, tempfile.TemporaryDirectory() as tmp:
        topic = f"fresh-{uuid.uuid4().hex[:6]}"
        service.create_topic(topic, 1)
        cfg = _stream_config(
            service.bootstrap, topic, redis_srv.url, Path(tmp), fetch_sessions=service.fetch_sessions_work
        )
        table = cfg.features.sparse_table("C1")
        daemon = TrainDaemon(cfg, registry=CollectorRegistry(), http=False)
        failures: list[BaseException] = []

        def train() -> None:
            try:
                daemon.run()
            except BaseException as exc:
                failures.append(exc)

        trainer = threading.Thread(target=train, name="bench-trainer", daemon=True)
        trainer.start()
        replica = ServingReplica(cfg, CollectorRegistry())
        replica.start()
        cached = RowFetcher(replica.store, ServingMetrics(CollectorRegistry()), CACHE_TTL_MS)
        stop_produce, stop_watch = threading.Event(), threading.Event()
        watcher = threading.Thread(
            target=_watch,
            args=(replica, table, topic, stop_watch, probes),
            kwargs={"cached": cached},
            daemon=True,
        )
        watcher.start()
        progress(
            f"producing {rate:,.0f} samples/s for {duration:.0f}s; "
            f"the trainer publishes every {PUBLISH_INTERVAL_S}s"
        )
        produced: list[int] = []
        producer = threading.Thread(
            target=lambda: produced.append(_produce(service.bootstrap, topic, rate, stop_produce, probes)),
            daemon=True,
        )
        started = time.perf_counter()
        producer.start()
        time.sleep(duration)
        stop_produce.set()
        producer.join(30)
        elapsed = time.perf_counter() - started
        # Let the last probes arrive: up to a publish interval (or a write-back) plus a few batches.
        deadline = time.monotonic() + max(PUBLISH_INTERVAL_S, cfg.store.hot_cache.writeback_interval_s) + 10
        while time.monotonic() < deadline:
            with probes.lock:
                if (
                    len(probes.dense_seen) >= len(probes.offset)
                    and len(probes.sparse_seen_cached) >= len(probes.sent)
                    and len(probes.update_seen_cached) >= len(probes.repeat_sent)
                ):
                    break
            time.sleep(0.1)
        stop_watch.set()
        watcher.join(5)
        daemon.request_stop("benchmark over")
        trainer.join(60)
        replica.close()

    if failures:
        raise failures[0]
    total = len(probes.sent)
    # The first seconds include the consumer group join and the first snapshot: warm-up, not lag.
    warm = 5.0
    first_sent = min(probes.sent.values()) if probes.sent else 0.0
    keep_s = [p for p in probes.sparse_seen if probes.sent[p] - first_sent >= warm]
    keep_d = [p for p in probes.dense_seen if probes.sent[p] - first_sent >= warm]
    sparse = _lags({p: probes.sparse_seen[p] for p in keep_s}, probes.sent)
    dense = _lags({p: probes.dense_seen[p] for p in keep_d}, probes.sent)
    keep_u = [p for p in probes.update_seen if probes.repeat_sent[p] - first_sent >= warm]
    update = _lags({p: probes.update_seen[p] for p in keep_u}, probes.repeat_sent)
    keep_sc = [p for p in probes.sparse_seen_cached if probes.sent[p] - first_sent >= warm]
    sparse_cached = _lags({p: probes.sparse_seen_cached[p] for p in keep_sc}, probes.sent)
    keep_uc = [p for p in probes.update_seen_cached if probes.repeat_sent[p] - first_sent >= warm]
    update_cached = _lags({p: probes.update_seen_cached[p] for p in keep_uc}, probes.repeat_sent)
    out: dict[str, Any] = {
        "workload": "criteo-synth (synthetic), 1 partition",
        "broker": service.label,
        "produce_rate": round((produced[0] if produced else 0) / elapsed, 1),
        "publish_interval_s": PUBLISH_INTERVAL_S,
        "batch_size": BATCH,
        "max_batch_delay_ms": MAX_BATCH_DELAY_MS,
        "probes": total,
        "probes_measured_sparse": len(sparse),
        "probes_measured_dense": len(dense),
        "probes_repeated": len(probes.repeat_sent),
        "probes_measured_sparse_update": len(update),
        "hot_cache": str(cfg.store.hot_cache.enabled),
        "writeback_interval_s": cfg.store.hot_cache.writeback_interval_s,
        "warmup_excluded_s": warm,
        "serving_cache_ttl_ms": CACHE_TTL_MS,
    }
    measured = (
        ("sparse", sparse),
        ("sparse_update", update),
        ("dense", dense),
        ("sparse_cached", sparse_cached),
        ("sparse_update_cached", update_cached),
    )
    for name, lags in measured:
        if len(lags):
            out[f"{name}_lag_p50_s"] = round(float(np.percentile(lags, 50)), 3)
            out[f"{name}_lag_p99_s"] = round(float(np.percentile(lags, 99)), 3)
            out[f"{name}_lag_max_s"] = round(float(lags.max()), 3)
        else:
            out[f"{name}_lag_p50_s"] = out[f"{name}_lag_p99_s"] = None
    progress(
        f"sparse lag p50 {out['sparse_lag_p50_s']}s p99 {out['sparse_lag_p99_s']}s; "
        f"sparse update lag p99 {out['sparse_update_lag_p99_s']}s "
        f"({out['sparse_update_cached_lag_p99_s']}s through a {CACHE_TTL_MS} ms row cache); "
        f"dense lag p50 {out['dense_lag_p50_s']}s"
    )
    return out
