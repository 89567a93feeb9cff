"""Write schema-v1 messages to a Kafka topic (``kelp produce``): a file replayed, or any message stream."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from kelp import progress
from kelp.consumers.bootstrap_check import watch_bootstrap
from kelp.consumers.errors import SourceUserError, translate_kafka_error
from kelp.consumers.kafka_client import RECORD_BATCH_BYTES
from kelp.errors import KelpError

__all__ = ["ProduceSummary", "file_messages", "produce"]

log = logging.getLogger(__name__)


@dataclass
class ProduceSummary:
    records: int
    messages: int
    bytes: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


def file_messages(
    path: Path, fmt: str, batch_size: int, source_cfg: Any = None, label: str = "label"
) -> Iterator[tuple[bytes, int]]:
    """(message, samples) from a file; rows are regrouped into columnar messages when batch_size > 1.

    ``label``: the label field's name (``features.label.name``) the samples carry.
    """
    from kelp.consumers import file_source as fs
    from kelp.consumers.csv_rows import iter_csv

    if fmt == "criteo_tsv":
        rows: Iterator[bytes] = fs.iter_criteo_tsv(path, label)
    elif fmt == "csv":
        if source_cfg is None or source_cfg.csv is None:
            raise SourceUserError(f"{path}: format csv needs a --config whose file source has a csv mapping")
        rows = iter_csv(path, source_cfg.csv, label)
    else:
        rows = fs.iter_msgpack_log(path)
    if batch_size == 1 or fmt == "msgpack":
        for r in rows:
            yield r, 1
        return
    # A columnar message can only say "missing dense value" by leaving the whole column out (a null
    # inside a column is NaN, rejected as bad_dense), so a group holds rows with the same dense names.
    group: list[dict[str, Any]] = []
    group_key: frozenset[str] | None = None
    for r in rows:
        sample = msgpack.unpackb(r, raw=False)
        key = frozenset(sample.get("dense", {}))
        if group and (key != group_key or len(group) == batch_size):
            yield _group_message(group, label), len(group)
            group = []
        group.append(sample)
        group_key = key
    if group:
        yield _group_message(group, label), len(group)


def _group_message(group: list[dict[str, Any]], label: str = "label") -> bytes:
    """Single-sample dicts -> one columnar message (list form, so odd values are validated by consumers).

    ``label`` is the first task's field; the other tasks' labels (``labels``) and
    the sample weights (``weight``, 1 where a sample has none) become columns too.
    """
    n = len(group)
    msg: dict[str, Any] = {"v": 1, "batch": n, label: [g.get(label) for g in group]}
    tasks = sorted({t for g in group for t in g.get("labels", {})})
    if tasks:
        msg["labels"] = {t: [g.get("labels", {}).get(t) for g in group] for t in tasks}
    if any("weight" in g for g in group):
        msg["weight"] = [g.get("weight", 1.0) for g in group]
    dense_names = sorted({k for g in group for k in g.get("dense", {})})
    if dense_names:
        msg["dense"] = {k: [g.get("dense", {}).get(k, np.nan) for g in group] for k in dense_names}
    sparse: dict[str, Any] = {}
    for k in sorted({k for g in group for k in g.get("sparse", {})}):
        vals = [g.get("sparse", {}).get(k) for g in group]
        sparse[k] = {
            "values": [v for v in vals if v is not None],
            "lengths": [0 if v is None else 1 for v in vals],
        }
    msg["sparse"] = sparse
    return msgpack.packb(msg, use_bin_type=True)


def produce(
    producer_cfg: dict[str, Any],
    topic: str,
    messages: Iterator[tuple[bytes, int]],
    *,
    rate: float | None = None,
    total: int | None = None,
    progress_every_s: float = 10.0,
    quiet: bool = False,
    connecting: str = "creating the producer",
) -> ProduceSummary:
    """Send messages, throttled to ``rate`` samples/s when given.

    ``connecting``: how an error while creating the producer (bootstrap) is introduced,
    e.g. naming the setting that bounds the wait.

    Progress goes to stderr unless ``quiet``: a bar over ``total`` samples (a
    counter when None) on a terminal (:mod:`kelp.progress` decides), else a
    log line every ``progress_every_s``.
    """
    from kafka import KafkaProducer

    try:
        with watch_bootstrap(producer_cfg):  # a refused login or certificate: a user error, not a timeout
            producer = KafkaProducer(
                linger_ms=20,
                batch_size=RECORD_BATCH_BYTES,
                max_request_size=8_388_608,
                acks="all",
                **producer_cfg,
            )
    except KelpError:
        raise
    except Exception as exc:
        raise translate_kafka_error(exc, connecting) from exc
    start = last = time.monotonic()
    records = msgs = nbytes = 0
    shown = progress.bar(
        total=total, desc=f"produce {topic}", unit="samples", unit_scale=True, wanted=not quiet
    )
    log_lines = not quiet and shown.disabled
    failed: list[BaseException] = []
    try:
        for value, n in messages:
            # A record the brokers never acknowledged (delivery timed out, a refusal that is not retriable)
            # fails only its future: without the errback it would count as produced.
            producer.send(topic, value).add_errback(failed.append)
            records += n
            msgs += 1
            nbytes += len(value)
            shown.update(n)
            if rate:
                ahead = records / rate - (time.monotonic() - start)
                if ahead > 0:
                    time.sleep(ahead)
            now = time.monotonic()
            if log_lines and now - last >= progress_every_s:
                last = now
                log.info(
                    "produced %s samples, %s messages, %.1f MB, %.0f samples/s",
                    f"{records:,}",
                    f"{msgs:,}",
                    nbytes / 1e6,
                    records / (now - start),
                )
        producer.flush()
        if failed:
            raise translate_kafka_error(
                failed[0], f"producing to {topic}: {len(failed)} of {msgs} messages not acknowledged"
            )
    except KelpError:
        raise  # already translated (e.g. a bad input file: a UserError, one line in the CLI)
    except Exception as exc:
        raise translate_kafka_error(exc, f"producing to {topic}") from exc
    finally:
        shown.close()
        producer.close()
    return ProduceSummary(records, msgs, nbytes, time.monotonic() - start)
