"""``kelp demo``: the main job end to end, on a fresh machine, in about a minute.

The demo grows with the system. Today it:

1. loads and validates the shipped Criteo config (the embedded default);
2. profiles the real Criteo sample the way the store will see it: positive
   rate, distinct ids per table, how many ids appear only once (what
   frequency admission saves) and how skewed accesses are (what a hot-row
   cache can win);
3. starts the real services it needs (redis-server, the Tansu broker) on
   free loopback ports, pushes the sample through a Kafka consumer group and
   records per-table id counts in Redis, then stops everything.

Missing binaries are reported and the service step is skipped, never faked.
"""

from __future__ import annotations

import collections
import csv
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kelp.config import KelpConfig, load_config

from kelp.errors import MissingBinaryError, UserError

__all__ = ["DemoReport", "default_config_path", "run_demo"]

Printer = Callable[[str], None]


def default_config_path() -> Path:
    """examples/criteo-kaggle.yaml next to the source tree (the demo runs from a checkout)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "examples" / "criteo-kaggle.yaml"
        if candidate.is_file():
            return candidate
    raise UserError("examples/criteo-kaggle.yaml not found; pass --config FILE")


@dataclass
class DemoReport:
    samples: int
    positive_rate: float
    tables: int
    distinct_ids: int
    singleton_share: float
    top1pct_access_share: float
    services_ran: bool


def _read_criteo(path: Path, limit: int | None) -> tuple[list[float], dict[str, list[str]]]:
    labels: list[float] = []
    columns: dict[str, list[str]] = collections.defaultdict(list)
    with path.open(newline="") as fh:
        for i, row in enumerate(csv.reader(fh, delimiter="\t")):
            if limit is not None and i >= limit:
                break
            labels.append(float(row[0]))
            for j in range(26):
                value = row[14 + j] if 14 + j < len(row) else ""
                if value:
                    columns[f"C{j + 1}"].append(value)
    return labels, columns


def _profile(cfg: KelpConfig, out: Printer) -> DemoReport:
    source = cfg.source.file
    if source is None or source.format != "criteo_tsv":
        raise UserError("the demo config must use a criteo_tsv file source")
    if not source.path.is_file():
        raise UserError(
            f"Criteo sample not found at {source.path} (expected ../shared/data beside the checkout)"
        )
    labels, columns = _read_criteo(source.path, source.limit)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for feature, values in columns.items():
        counts.update((cfg.features.sparse_table(feature), v) for v in values)
    accesses = sum(counts.values())
    singletons = sum(1 for c in counts.values() if c == 1)
    top = sorted(counts.values(), reverse=True)[: max(1, len(counts) // 100)]
    report = DemoReport(
        samples=len(labels),
        positive_rate=sum(labels) / max(1, len(labels)),
        tables=len({t for t, _ in counts}),
        distinct_ids=len(counts),
        singleton_share=singletons / max(1, len(counts)),
        top1pct_access_share=sum(top) / max(1, accesses),
        services_ran=False,
    )
    min_count = max(t.admission.min_count for t in cfg.features.tables)
    out(f"  samples            {report.samples}  (positive rate {report.positive_rate:.3f})")
    out(f"  embedding tables   {report.tables}, {report.distinct_ids} distinct ids, {accesses} id accesses")
    out(f"  ids seen once      {report.singleton_share:.1%}  -> min_count={min_count} admission skips them")
    out(f"  hottest 1% of ids  {report.top1pct_access_share:.1%} of all accesses  -> a hot-row cache's share")
    return report


def _services(cfg: KelpConfig, out: Printer, limit: int) -> bool:
    from kafka import KafkaConsumer, KafkaProducer
    from kelp.harness import RedisServer, TansuBroker

    source = cfg.source.file
    assert source is not None
    try:
        redis_srv = RedisServer()
        broker = TansuBroker()
    except MissingBinaryError as exc:
        out(f"  skipped: {exc}")
        return False
    with redis_srv, broker:
        out(f"  redis-server on {redis_srv.url}, Tansu broker on {broker.bootstrap}")
        topic = "criteo-demo"
        broker.create_topic(topic, partitions=2)
        started = time.perf_counter()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
        sent = 0
        with source.path.open("rb") as fh:
            for line in fh:
                if sent >= limit:
                    break
                producer.send(topic, value=line.rstrip(b"\n"))
                sent += 1
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=broker.bootstrap,
            group_id="kelp-demo",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_interval_ms=5000,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
        )
        client = redis_srv.client()
        received = 0
        deadline = time.monotonic() + 60
        while received < sent and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                pipe = client.pipeline(transaction=False)
                for record in records:
                    fields = record.value.split(b"\t")
                    for j, value in enumerate(fields[14:40]):
                        if value:
                            pipe.pfadd(f"kelp:demo:distinct:{cfg.features.sparse_table(f'C{j + 1}')}", value)
                pipe.execute()
                received += len(records)
            consumer.commit()
        consumer.close()
        elapsed = time.perf_counter() - started
        distinct = sum(int(client.pfcount(k)) for k in client.scan_iter("kelp:demo:distinct:*"))
        out(
            f"  {sent} records produced and {received} consumed through a consumer group in {elapsed:.1f}s; "
            f"offsets committed"
        )
        out(f"  Redis HyperLogLogs estimate {distinct} distinct ids across tables")
        if received != sent:
            raise UserError(f"demo consumed {received} of {sent} records")
    out("  services stopped")
    return True


def run_demo(
    config_path: Path | None = None, out: Printer = print, service_records: int = 2000
) -> DemoReport:
    path = config_path or default_config_path()
    out(f"[1/3] config {path}")
    cfg = load_config(path)
    out(
        f"  deployment={cfg.deployment} source={cfg.source.kind} store={cfg.store.backend} "
        f"model={cfg.trainer.model} ({len(cfg.features.dense)} dense, {len(cfg.features.sparse)} sparse)"
    )
    out("[2/3] profile of the real Criteo sample")
    report = _profile(cfg, out)
    out("[3/3] real services: Tansu (Kafka protocol) and redis-server")
    report.services_ran = _services(cfg, out, service_records)
    out("demo finished: training, serving and publishing are not built yet (see README status)")
    return report
