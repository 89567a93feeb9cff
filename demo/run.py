"""``kelp demo``: the main job end to end, on a fresh machine, in about a minute.

The demo grows with the system. Today it:

1. loads and validates the shipped Criteo config;
2. profiles the real Criteo sample the way the store will see it: positive
   rate, distinct ids per table, how many ids appear only once (what
   frequency admission saves) and how skewed accesses are (what a hot-row
   cache can win);
3. starts a real redis-server and a Kafka broker (Apache Kafka where Java
   runs, Tansu otherwise) on free loopback ports,
   produces the sample (plus three malformed records) into a topic, and runs
   the trainer's loop on it: micro-batches from a consumer group, rows pulled
   from Redis with admission, dlrm-small trained with progressive validation,
   rows pushed back, offsets committed only after the store acknowledged, a
   dense snapshot published to Redis. It prints the AUC progression, the
   dead-lettered records and how many rows Redis holds;
4. starts ``kelp serve`` on the same Redis, scores real rows and a
   user-with-candidates request, shows a pushed embedding row changing a
   score without any publish, and stops everything
   (:mod:`kelp.demo.serving`).

Without the binaries it says so and runs the embedded path instead (file
source, in-memory store); it never fakes a service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from kelp.config import FileSourceConfig, KelpConfig, load_config
from kelp.errors import MissingBinaryError, UserError
from kelp.examples import example_path
from kelp.store import build_store

__all__ = ["DemoReport", "default_config_path", "run_demo"]

Printer = Callable[[str], None]


def default_config_path() -> Path:
    """The shipped ``criteo-kaggle.yaml`` example (package data, so it is found in a wheel too)."""
    return example_path("criteo-kaggle.yaml")


@dataclass
class DemoReport:
    samples: int
    positive_rate: float
    tables: int
    distinct_ids: int
    singleton_share: float
    top1pct_access_share: float
    services_ran: bool = False
    trained_samples: int = 0
    progressive_auc: float = float("nan")
    redis_rows: int = 0
    rejected: dict[str, int] | None = None
    serving: dict[str, Any] | None = None


def _id_counts(cfg: KelpConfig) -> tuple[int, float, dict[str, np.ndarray]]:
    """(samples, positive rate, per-table count of each distinct id), read by Kelp's own file source."""
    from kelp.consumers import build_source

    samples, positives = 0, 0.0
    ids: dict[str, list[np.ndarray]] = {}
    with build_source(cfg.source, cfg.features, cfg.batching, CollectorRegistry()) as source:
        for batch in source:
            samples += batch.size
            positives += float(batch.labels.sum())
            for feature, jagged in batch.sparse.items():
                ids.setdefault(cfg.features.sparse_table(feature), []).append(jagged.values)
    counts = {t: np.unique(np.concatenate(parts), return_counts=True)[1] for t, parts in ids.items()}
    return samples, positives / max(1, samples), counts


def _profile(cfg: KelpConfig, out: Printer) -> DemoReport:
    source = cfg.source
    if not isinstance(source, FileSourceConfig) or source.format != "criteo_tsv":
        raise UserError("the demo config must use a criteo_tsv file source")
    if not source.path.is_file():
        raise UserError(
            f"Criteo sample not found at {source.path} (Kelp ships it in examples/data; "
            "or set KELP_SOURCE__PATH=/path/to/train.tsv)"
        )
    samples, positive_rate, per_table = _id_counts(cfg)
    counts = np.concatenate(list(per_table.values())) if per_table else np.zeros(0, dtype=np.int64)
    accesses = int(counts.sum())
    top = np.sort(counts)[::-1][: max(1, len(counts) // 100)]
    report = DemoReport(
        samples=samples,
        positive_rate=positive_rate,
        tables=len(per_table),
        distinct_ids=len(counts),
        singleton_share=float(np.count_nonzero(counts == 1)) / max(1, len(counts)),
        top1pct_access_share=float(top.sum()) / max(1, accesses),
    )
    min_count = max(t.admission.min_count for t in cfg.features.tables)
    out(f"  samples            {report.samples}  (positive rate {report.positive_rate:.3f})")
    out(f"  embedding tables   {report.tables}, {report.distinct_ids} distinct ids, {accesses} id accesses")
    out(f"  ids seen once      {report.singleton_share:.1%}  -> min_count={min_count} admission skips them")
    out(f"  hottest 1% of ids  {report.top1pct_access_share:.1%} of all accesses  -> a hot-row cache's share")
    return report


def _poison_records() -> list[bytes]:
    """Three records a real stream will contain sooner or later; each must reach the dead letter."""
    import msgpack

    return [
        b"\xc1 not msgpack",
        msgpack.packb({"v": 99, "label": 1}),
        msgpack.packb({"v": 1, "label": 1, "dense": {"I1": float("nan")}}),
    ]


def _stream_config(
    cfg: KelpConfig, bootstrap: str, topic: str, redis_url: str | None, *, fetch_sessions: bool = True
) -> KelpConfig:
    """The demo config moved onto the production path: Kafka source and (when given) a Redis store."""
    from kelp.config import KafkaSourceConfig, PublisherConfig, StoreConfig

    stream = cfg.model_copy(deep=True)
    stream.source = KafkaSourceConfig(
        bootstrap_servers=[bootstrap],
        topics=[topic],
        group_id="kelp-demo",
        dead_letter_topic=f"{topic}-dead-letter",
        max_poll_interval_ms=5000,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        incremental_fetch_sessions=fetch_sessions,  # off on Tansu: it mishandles them for paused partitions
    )
    if redis_url is not None:
        stream.store = StoreConfig(backend="redis", urls=[redis_url])
        stream.publisher = PublisherConfig(channel="redis", interval_s=2.0, keep_versions=3)
    return stream


def _train(
    cfg: KelpConfig, out: Printer, expected_samples: int, registry: CollectorRegistry, publish: bool = False
) -> TrainSummary:
    """Run the ``kelp train`` daemon on the stream until every sample is trained, then drain it."""
    import tempfile
    import threading

    from kelp.daemon.train import TrainDaemon

    cfg = cfg.model_copy(deep=True)
    workdir = Path(tempfile.mkdtemp(prefix="kelp-demo-"))
    cfg.trainer.checkpoint_dir = workdir / "checkpoints"  # a fresh model each demo
    cfg.trainer.eval_window_batches = 8
    cfg.trainer.log_every_s = 3600.0  # the demo prints its own progress lines
    cfg.publisher.enabled = publish
    summary = TrainSummary()

    def on_step(step: int, batch: Any, result: Any) -> None:
        summary.steps, summary.samples = step, summary.samples + batch.size
        summary.losses.append(result.loss)
        if step % 6 == 0:
            window, total = daemon.validator.windowed(), daemon.validator.cumulative()
            out(
                f"  step {step:>3}  samples {summary.samples:>5}  loss {result.loss:.4f}  "
                f"AUC window {window.auc:.3f}  cumulative {total.auc:.3f}"
            )
        if summary.samples >= expected_samples:
            daemon.request_stop("every sample trained")

    daemon = TrainDaemon(cfg, registry=registry, http=False, on_step=on_step)

    def watchdog() -> None:  # a demo never hangs: stop when the stream goes quiet
        seen = -1
        while not stopped.wait(20.0):
            if summary.samples == seen:
                daemon.request_stop("stream idle for 20s")
                return
            seen = summary.samples

    stopped = threading.Event()
    threading.Thread(target=watchdog, daemon=True).start()
    try:
        report = daemon.run()
    finally:
        stopped.set()
    summary.seconds = report.seconds
    summary.auc = report.auc
    summary.checkpoint = report.checkpoint
    summary.published_version = report.published_version
    return summary


@dataclass
class TrainSummary:
    steps: int = 0
    samples: int = 0
    seconds: float = 0.0
    auc: float = float("nan")
    losses: list[float] = field(default_factory=list)
    checkpoint: str | None = None
    published_version: int | None = None


def _stored_rows(cfg: KelpConfig) -> int:
    """Rows this deployment holds in Redis, counted by the store itself (either row layout)."""
    from kelp.store.redis.shared import RedisStoreBase

    with build_store(cfg.store, cfg.features.store_tables(), cfg.deployment) as store:
        assert isinstance(store, RedisStoreBase)
        return sum(t["rows"] for t in store.count_keys().values())


def _stream(cfg: KelpConfig, out: Printer, limit: int | None, samples: int) -> DemoStream:
    """Produce the sample into a real broker, train from it against a real Redis, report."""
    from kafka import KafkaProducer

    from kelp.consumers.produce import file_messages, produce
    from kelp.demo.serving import demo_serving
    from kelp.harness import RedisServer, make_broker

    source = cfg.source
    assert isinstance(source, FileSourceConfig)
    registry = CollectorRegistry()
    try:
        redis_srv, broker = RedisServer(), make_broker()
    except MissingBinaryError as exc:
        out(f"  real services unavailable ({exc})")
        out("  falling back to the embedded path: file source + in-memory store")
        summary = _train(cfg, out, samples if limit is None else min(samples, limit), registry)
        return DemoStream(summary, False, 0, None)
    with redis_srv, broker:
        out(f"  redis-server {redis_srv.url}   {broker.label} {broker.bootstrap}")
        topic = "criteo-demo"
        broker.create_topic(topic, partitions=2)
        broker.create_topic(f"{topic}-dead-letter", partitions=1)
        messages = file_messages(source.path, source.format, batch_size=64)
        if limit is not None:
            messages = _take_samples(messages, limit)
        produced = produce({"bootstrap_servers": broker.bootstrap}, topic, messages, quiet=True)
        poison = KafkaProducer(bootstrap_servers=broker.bootstrap)
        for value in _poison_records():
            poison.send(topic, value)
        poison.flush()
        poison.close()
        out(
            f"  produced {produced.records} samples in {produced.messages} columnar messages "
            f"({produced.bytes / 1e6:.1f} MB) + 3 malformed records"
        )
        stream_cfg = _stream_config(
            cfg, broker.bootstrap, topic, redis_srv.url, fetch_sessions=broker.fetch_sessions_work
        )
        summary = _train(stream_cfg, out, produced.records, registry, publish=True)
        rejected = {
            reason: int(registry.get_sample_value("kelp_records_rejected_total", {"reason": reason}) or 0)
            for reason in ("bad_msgpack", "bad_version", "bad_dense")
        }
        rows = _stored_rows(stream_cfg)
        out(f"  dead-lettered with reasons: {rejected}")
        out(
            f"  trained {summary.samples} samples in {summary.steps} steps; published snapshot "
            f"v{summary.published_version}; Redis holds {rows} embedding rows"
        )
        out("[4/4] serve: kelp serve on the same Redis -> score requests -> a sparse update without publish")
        serving = demo_serving(stream_cfg, source.path, out)
    out("  services stopped")
    return DemoStream(summary, True, rows, rejected, serving)


@dataclass
class DemoStream:
    summary: TrainSummary
    services_ran: bool
    redis_rows: int
    rejected: dict[str, int] | None
    serving: dict[str, Any] | None = None


def _take_samples(messages: Iterator[tuple[bytes, int]], limit: int) -> Iterator[tuple[bytes, int]]:
    taken = 0
    for value, n in messages:
        if taken >= limit:
            return
        taken += n
        yield value, n


def run_demo(config_path: Path | None = None, out: Printer = print, limit: int | None = None) -> DemoReport:
    path = config_path or default_config_path()
    out(f"[1/4] config {path}")
    cfg = load_config(path)
    out(
        f"  deployment={cfg.deployment} model={cfg.trainer.model} "
        f"({len(cfg.features.dense)} dense, {len(cfg.features.sparse)} sparse features)"
    )
    out("[2/4] profile of the real Criteo sample")
    report = _profile(cfg, out)
    out("[3/4] train: Criteo sample -> Kafka -> kelp train -> Redis store -> dlrm-small")
    stream = _stream(cfg, out, limit, report.samples)
    summary = stream.summary
    report.services_ran = stream.services_ran
    report.trained_samples = summary.samples
    report.progressive_auc = summary.auc
    report.redis_rows = stream.redis_rows
    report.rejected = stream.rejected
    report.serving = stream.serving
    rate = summary.samples / summary.seconds if summary.seconds else 0.0
    out(
        f"  trained {summary.samples} samples in {summary.steps} steps ({rate:,.0f} samples/s); "
        f"progressive AUC {summary.auc:.3f}, first/last loss {summary.losses[0]:.3f}/{summary.losses[-1]:.3f}"
    )
    if stream.services_ran:
        out(
            f"  Redis holds {stream.redis_rows} embedding rows for {report.distinct_ids} distinct ids "
            f"(admission min_count keeps one-off ids out)"
        )
    out("demo finished.")
    return report
