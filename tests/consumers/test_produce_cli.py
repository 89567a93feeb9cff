"""``kelp produce`` end to end: the real CLI in a subprocess, the real Tansu broker, consumed back.

The consumed records are decoded with the same :class:`Decoder` the Kafka
source uses, so "what was produced" is checked sample by sample, not by count alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kafka import KafkaConsumer
from kafka.structs import TopicPartition
from prometheus_client import CollectorRegistry

from kelp.bench.synth import CriteoSynth
from kelp.config import BatchingConfig, FileSourceConfig
from kelp.consumers import criteo_feature_spec
from kelp.consumers.decode import Chunk, Decoder
from kelp.consumers.file_source import FileSource

from .conftest import DATA

pytestmark = pytest.mark.integration

TSV = DATA / "criteo_sample.tsv"
TSV_ROWS = 21


def kelp_produce(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kelp.cli", "produce", *map(str, args)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def summary_of(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def read_topic(bootstrap: str, topic: str, expect: int) -> list[Any]:
    """Every record of partition 0 (no consumer group), checked against the fetch high watermark.

    Tansu answers ListOffsets(latest) with the last record *batch*'s base offset + 1, so
    ``end_offsets`` is not used; the high watermark of a fetch response is exact.
    """
    tp = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records: list[Any] = []
        deadline = time.monotonic() + 30  # only so a broken broker cannot hang the run
        while len(records) < expect and time.monotonic() < deadline:
            records += consumer.poll(timeout_ms=500).get(tp, [])
        records += consumer.poll(timeout_ms=200).get(tp, [])  # nothing more
        assert [r.offset for r in records] == list(range(len(records)))
        assert consumer.highwater(tp) == len(records)
        return records
    finally:
        consumer.close()


def decode_all(records: list[Any]) -> Chunk:
    chunk = Decoder(criteo_feature_spec()).decode(records)
    assert [(r.reason, r.rows) for r in chunk.rejections] == []
    return chunk


def check_summary(summary: dict[str, Any], topic: str, samples: int, records: list[Any]) -> None:
    assert summary["topic"] == topic
    assert summary["records"] == samples
    assert summary["messages"] == len(records)
    assert summary["bytes"] == sum(len(r.value) for r in records)
    assert summary["seconds"] > 0
    assert summary["rate"] > 0


@pytest.mark.parametrize("batch_size", [1, 256])
def test_produce_criteo_tsv_file(kafka_broker, unique_topic: str, batch_size: int) -> None:  # type: ignore[no-untyped-def]
    kafka_broker.create_topic(unique_topic, 1)
    proc = kelp_produce(
        "--bootstrap", kafka_broker.bootstrap, "--topic", unique_topic,
        "--file", TSV, "--format", "criteo_tsv", "--batch-size", str(batch_size),
    )  # fmt: skip
    summary = summary_of(proc)
    records = read_topic(kafka_broker.bootstrap, unique_topic, summary["messages"])
    if batch_size == 1:
        assert len(records) == TSV_ROWS
    else:  # grouped into columnar messages
        assert len(records) < TSV_ROWS
    chunk = decode_all(records)
    # Every row arrives, as the file source reads it: same labels, dense values and ids, same order
    # (rows with missing dense values included: they must not be lost when rows are grouped).
    assert chunk.size == TSV_ROWS
    expected = list(
        FileSource(
            FileSourceConfig(path=TSV, format="criteo_tsv"),
            criteo_feature_spec(),
            BatchingConfig(batch_size=64),
            CollectorRegistry(),
        )
    )
    assert len(expected) == 1
    want = expected[0]
    np.testing.assert_array_equal(chunk.labels, want.labels)
    np.testing.assert_array_equal(chunk.dense, want.dense)
    for name, ids in want.sparse.items():
        np.testing.assert_array_equal(chunk.values[name], ids.values)
        np.testing.assert_array_equal(chunk.lengths[name], ids.lengths())
    check_summary(summary, unique_topic, TSV_ROWS, records)


def test_produce_criteo_synth_batched(kafka_broker, unique_topic: str) -> None:  # type: ignore[no-untyped-def]
    kafka_broker.create_topic(unique_topic, 1)
    samples, per_message = 1000, 64
    proc = kelp_produce(
        "--bootstrap", kafka_broker.bootstrap, "--topic", unique_topic, "--synth", "criteo",
        "--samples", str(samples), "--batch-size", str(per_message), "--seed", "3",
    )  # fmt: skip
    summary = summary_of(proc)
    records = read_topic(kafka_broker.bootstrap, unique_topic, -(-samples // per_message))
    assert len(records) == -(-samples // per_message)
    chunk = decode_all(records)
    assert chunk.size == samples
    want = CriteoSynth(seed=3).batch(samples)
    np.testing.assert_array_equal(chunk.labels, want.label)
    for i, name in enumerate(f"C{k}" for k in range(1, 27)):
        np.testing.assert_array_equal(chunk.values[name], want.sparse[:, i])
    check_summary(summary, unique_topic, samples, records)


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def test_bad_invocations_exit_2_with_one_line(kafka_broker, unique_topic: str, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "nope.tsv"
    proc = kelp_produce("--bootstrap", kafka_broker.bootstrap, "--topic", unique_topic, "--file", missing)
    assert proc.stderr.strip().splitlines() == [f"kelp: error: {missing}: no such file"]
    one_line_error(proc)

    proc = kelp_produce(
        "--bootstrap", kafka_broker.bootstrap, "--topic", unique_topic, "--file", TSV, "--format", "parquet"
    )
    assert "invalid choice: 'parquet'" in one_line_error(proc)

    # csv needs a column mapping, which only a config gives: a one-line error, not an AttributeError.
    kafka_broker.create_topic(unique_topic, 1)
    csv = DATA / "attribution_sample.csv"
    proc = kelp_produce(
        "--bootstrap", kafka_broker.bootstrap, "--topic", unique_topic, "--file", csv, "--format", "csv"
    )
    assert "csv mapping" in one_line_error(proc)
