"""``kelp bench ingest``: Kafka -> decoded, validated, deduplicated micro-batches vs a plain poll.

Starts its own broker (Apache Kafka by default, Tansu with ``--broker tansu``;
the JSON's ``broker`` names it), produces criteo-synth (synthetic) three
times, as columnar messages of 256 samples, as single-sample messages and as
JSON events (one nested object per message, read with ``format: json`` and a
field mapping: the ``json_`` keys), then for each topic measures, with the
same consumer settings:

* Kelp's :class:`~kelp.consumers.kafka_source.KafkaSource` yielding
  micro-batches of 4096 whose per-table ``unique_ids`` are computed, with a
  fresh consumer group each run, timed from its first batch to its last
  full one (see :func:`_kelp`);
* the baseline: kafka-python ``KafkaConsumer.poll`` of the same messages,
  no decoding at all, timed from its first non-empty poll; one consumer,
  rewound to the beginning between runs.

The two alternate ``REPS`` times on the same topic; the JSON has medians,
the median per-pair ratio and every run (``runs``: ``[raw, kelp]``).
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from kelp.bench.runner import progress
from kelp.bench.synth import CriteoSynth, synth_messages
from kelp.config import BatchingConfig, KafkaSourceConfig
from kelp.consumers.criteo import DENSE_NAMES, SPARSE_NAMES, criteo_feature_spec
from kelp.consumers.kafka_client import consumer_settings
from kelp.consumers.kafka_source import KafkaSource
from kelp.consumers.produce import produce
from kelp.harness import make_broker

__all__ = ["bench_kafka", "run"]

PER_MESSAGE = 256
BATCH = 4096
REPS = 3  # runs of each side, alternating (see _side_by_side)


JSON_MAPPING = {
    "label_field": "label",
    "event_time_field": "ts",
    "dense_fields": {n: f"counts.{n}" for n in DENSE_NAMES},
    "sparse_fields": {n: f"ids.{n}" for n in SPARSE_NAMES},
}
"""Where criteo-synth's fields sit in its JSON events (:func:`json_messages`)."""


def json_messages(samples: int, seed: int = 0, step: int = 65_536) -> Iterator[tuple[bytes, int]]:
    """(message, 1) per criteo-synth sample as a nested JSON object, as an application would log it::

    {"label": 1.0, "ts": 1700000000.5, "counts": {"I1": 3.0, ...}, "ids": {"C1": 123, ...}}
    """
    synth = CriteoSynth(seed=seed)
    done = 0
    while done < samples:
        n = min(step, samples - done)
        cols = synth.batch(n)
        dense, sparse = cols.dense.tolist(), cols.sparse.tolist()
        for i, (label, ts) in enumerate(zip(cols.label.tolist(), cols.ts.tolist(), strict=True)):
            event = {
                "label": label,
                "ts": ts,
                "counts": dict(zip(DENSE_NAMES, dense[i], strict=True)),
                "ids": dict(zip(SPARSE_NAMES, sparse[i], strict=True)),
            }
            yield orjson.dumps(event), 1
        done += n


def bench_kafka(bootstrap: str, topic: str, **overrides: Any) -> KafkaSourceConfig:
    return KafkaSourceConfig(
        bootstrap_servers=[bootstrap],
        topics=[topic],
        group_id=f"bench-{uuid.uuid4().hex[:8]}",
        dead_letter_topic=None,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        max_poll_interval_ms=5000,
        max_message_bytes=4_194_304,
        max_partition_fetch_bytes=8_388_608,
        **overrides,
    )


def _kelp(bootstrap: str, topic: str, samples: int, **overrides: Any) -> tuple[float, dict[str, Any]]:
    src = KafkaSource(
        bench_kafka(bootstrap, topic, **overrides),
        criteo_feature_spec(),
        BatchingConfig(batch_size=BATCH, max_batch_delay_ms=200, queue_depth=8),
        CollectorRegistry(),
    )
    got = batches = uniq = ids = 0
    start = None
    full_got, full_at = 0, float("nan")  # samples and time at the last batch cut by size
    try:
        while got < samples:
            batch = src.poll(30)
            if batch is None:
                raise RuntimeError(f"kelp source stalled at {got}/{samples} samples")
            if start is None:  # time from the first batch: group join is not ingest
                start = time.perf_counter()
                first = batch.size
            uniq += sum(t.unique_ids.size for t in batch.tables.values())
            ids += batch.num_ids()
            got += batch.size
            batches += 1
            src.commit(batch)
            if batch.size >= BATCH:
                full_got, full_at = got, time.perf_counter()
        end = time.perf_counter()
    finally:
        src.close()
    # The stream is finite: its last partial batch waits max_batch_delay_ms for samples that never
    # come (a large share of a quick run). That is the latency bound at work, not ingest
    # throughput, and a plain poll has no such tail, so the rate is taken up to the last full batch.
    if start is None or full_got <= first:
        return float("nan"), {"batches": batches}
    return (full_got - first) / (full_at - start), {
        "batches": batches,
        "unique_id_ratio": round(uniq / max(ids, 1), 4),
        "tail_wait_s": round(end - full_at, 3),
    }


def _raw(consumer: Any, messages: int, per_message: int) -> float:
    """Samples/s of a plain poll of all ``messages``, timed from the first poll that returns any."""
    got = 0
    start = None
    first = 0
    while got < messages:
        polled = consumer.poll(timeout_ms=1000)
        n = sum(len(v) for v in polled.values())
        if n and start is None:
            start = time.perf_counter()
            first = n
        got += n
    elapsed = time.perf_counter() - start if start else float("nan")
    return (got - first) * per_message / elapsed


def run(quick: bool, broker: str | None = None) -> dict[str, Any]:
    # Quick sizes: large enough that each poll runs long enough to measure either side in steady
    # state on a shared machine (docs/performance.md).
    batched_samples = 600_000 if quick else 2_000_000
    single_samples = 40_000 if quick else 200_000
    json_source = {"format": "json", "json": JSON_MAPPING}
    out: dict[str, Any] = {
        "workload": "criteo-synth (synthetic)",
        "samples_per_message": PER_MESSAGE,
        "reps": REPS,
    }
    service = make_broker(broker)
    out["broker"] = service.label
    progress(f"starting {service.label}")
    with service:
        for label, samples, per, source in (
            ("", batched_samples, PER_MESSAGE, {}),
            ("single_", single_samples, 1, {}),
            ("json_", single_samples, 1, json_source),
        ):
            topic = f"ingest-{label or 'batched_'}{uuid.uuid4().hex[:6]}"
            service.create_topic(topic, 2)
            progress(f"producing {samples:,} samples, {per} per message, to {topic}")
            messages = json_messages(samples) if source else synth_messages(samples, per)
            summary = produce({"bootstrap_servers": [service.bootstrap]}, topic, messages, quiet=True)
            progress(
                f"produced {summary.messages:,} messages, {summary.bytes / 1e6:.1f} MB "
                f"in {summary.seconds:.1f}s"
            )
            out.update(
                _side_by_side(
                    service.bootstrap,
                    topic,
                    samples=samples,
                    messages=summary.messages,
                    per=per,
                    label=label,
                    source=source,
                )
            )
            out[f"{label}message_bytes"] = round(summary.bytes / summary.messages, 1)
    return out


def _side_by_side(
    bootstrap: str,
    topic: str,
    *,
    samples: int,
    messages: int,
    per: int,
    label: str,
    source: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``REPS`` plain polls and Kelp runs, alternating on the same topic; medians and every run.

    ``source`` overrides Kelp's source settings (the record format); the
    plain poll reads the same records without decoding either way.

    One run of each side is a fraction of a second, and on a shared machine
    a neighbour's burst can halve either one; alternating the two and taking
    medians keeps a burst from deciding the ratio. The ratio is the median of
    the per-pair ratios, so each Kelp run is compared with the plain poll
    measured just before it.
    """
    from kafka import KafkaConsumer

    raws: list[float] = []
    kelps: list[float] = []
    extras: list[dict[str, Any]] = []
    # One plain consumer for all its runs, rewound between them: a group join costs seconds on
    # some brokers (Tansu's initial rebalance delay), and re-reading with a joined, warm consumer
    # can only help it.
    consumer = KafkaConsumer(topic, **consumer_settings(bench_kafka(bootstrap, topic)))
    try:
        for rep in range(REPS):
            if rep:
                consumer.seek_to_beginning()
            raws.append(_raw(consumer, messages, per))
            kelp, extra = _kelp(bootstrap, topic, samples, **(source or {}))
            kelps.append(kelp)
            extras.append(extra)
            progress(f"run {rep + 1}/{REPS}: raw poll {raws[-1]:,.0f}, kelp batches {kelp:,.0f} samples/s")
    finally:
        consumer.close(autocommit=False)
    return {
        f"{label}batches_samples_per_s": round(statistics.median(kelps), 1),
        f"{label}raw_poll_samples_per_s": round(statistics.median(raws), 1),
        f"{label}ratio": round(statistics.median(k / r for k, r in zip(kelps, raws, strict=True)), 3),
        f"{label}runs": [[round(r), round(k)] for r, k in zip(raws, kelps, strict=True)],
        f"{label}tail_wait_s": statistics.median(e.get("tail_wait_s", float("nan")) for e in extras),
        f"{label}unique_id_ratio": extras[-1].get("unique_id_ratio"),
    }
