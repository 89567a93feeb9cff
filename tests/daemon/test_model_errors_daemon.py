"""A plug-in model that raises mid-stream: odd samples are dead-lettered and training goes on;
a model that raises on everything stops the trainer with one line, dead-lettering and committing nothing."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client import CollectorRegistry

from kelp.config import FeatureSpec, KelpConfig
from kelp.consumers.batch import MicroBatch, SourceRange
from kelp.consumers.codec import encode_sample
from kelp.consumers.deadletter import LogDeadLetter
from kelp.consumers.decode import Decoder, Rec
from kelp.consumers.metrics import ConsumerMetrics
from kelp.daemon.model_errors import BrokenModelError, ModelErrors, encode_row
from kelp.daemon.train import TrainDaemon
from kelp.harness import KafkaBroker
from kelp.harness.topic_reader import read_topic
from kelp.trainer import build_model
from kelp.trainer.checkpoint import load_latest
from kelp.trainer.isolate import ModelErrorRows
from kelp.trainer.step import StageTimer, StepResult, TrainStep

from .conftest import Running, base_config, on_kafka, write_config

PLUGINS = Path(__file__).resolve().parents[1] / "trainer" / "plugin_models"
MARKER = 12345.0  # tiny_models.MARKER
SPEC = FeatureSpec(dense=[{"name": "d"}], sparse=[{"name": "user"}])


def _batch(n: int, first: int = 0) -> MicroBatch:
    return MicroBatch.from_columns(
        SPEC,
        labels=np.arange(n) % 2,
        dense=np.arange(n, dtype=np.float32).reshape(n, 1),
        sparse={"user": np.arange(n, dtype=np.uint64) + 100},
        sources=[SourceRange("t", 0, first, first + n - 1)],
    )


def _result(n: int, failed: list[int], *, whole: bool = False) -> StepResult:
    parts = (ModelErrorRows(np.array(failed, dtype=np.int64), "ValueError: odd"),) if failed else ()
    return StepResult(
        loss=0.5,
        logits=np.zeros(n - len(failed), np.float32),
        updates={},
        skipped="model_error" if whole else None,
        model_errors=parts,
    )


def test_wholly_failed_batches_are_held_until_one_trains_and_a_run_of_them_stops_the_trainer() -> None:
    registry = CollectorRegistry()
    metrics = ConsumerMetrics(registry)
    errors = ModelErrors(SPEC, lambda: LogDeadLetter(metrics), max_failed_batches=3)
    rejected = lambda: registry.get_sample_value("kelp_records_rejected_total", {"reason": "model_error"})  # noqa: E731

    alone = _batch(1, first=10)  # the odd sample, alone in its batch
    assert errors.after(alone, _result(1, [0], whole=True)).hold and errors.held == 1
    assert rejected() is None  # not dead-lettered yet: it may be the model that is broken
    verdict = errors.after(_batch(8, first=11), _result(8, [2]))  # a batch trains: the model works
    assert not verdict.hold and verdict.released == [alone]
    assert rejected() == 2 and errors.rejected == 2 and errors.held == 0

    for i in range(2):
        assert errors.after(_batch(4, first=20 + 4 * i), _result(4, [0, 1, 2, 3], whole=True)).hold
    with pytest.raises(
        BrokenModelError, match=r"every sample of 3 batch\(es\) in a row.*ValueError: odd"
    ) as info:
        errors.after(_batch(4, first=28), _result(4, [0, 1, 2, 3], whole=True))
    assert "\n" not in str(info.value) and rejected() == 2  # the broken model's batches: no dead letters


def test_a_step_skipped_as_nonfinite_keeps_the_held_batches_held() -> None:
    registry = CollectorRegistry()
    errors = ModelErrors(SPEC, lambda: LogDeadLetter(ConsumerMetrics(registry)), max_failed_batches=3)
    rejected = lambda: registry.get_sample_value("kelp_records_rejected_total", {"reason": "model_error"})  # noqa: E731

    alone = _batch(1, first=10)
    assert errors.after(alone, _result(1, [0], whole=True)).hold
    nonfinite = dataclasses.replace(_result(8, [2]), skipped="nonfinite_loss")
    verdict = errors.after(_batch(8, first=11), nonfinite)  # nothing trained: no proof the model works
    assert not verdict.hold and verdict.released == []
    assert errors.held == 1 and errors.trained_through({("t", 0): 19}) == {("t", 0): 10}
    assert rejected() == 1  # its own failed sample only: that batch is committed
    verdict = errors.after(_batch(4, first=19), _result(4, []))  # a batch trains
    assert verdict.released == [alone] and errors.held == 0 and rejected() == 2
    assert errors.trained_through({("t", 0): 23}) == {("t", 0): 23}


def test_trained_through_stops_each_partition_at_its_first_held_record() -> None:
    errors = ModelErrors(
        SPEC, lambda: LogDeadLetter(ConsumerMetrics(CollectorRegistry())), max_failed_batches=5
    )
    held = _batch(2, first=40)
    held.sources.append(SourceRange("t", 1, 7, 9))
    errors.after(held, _result(2, [0, 1], whole=True))
    errors.after(_batch(2, first=50), _result(2, [0, 1], whole=True))
    offsets = {("t", 0): 60, ("t", 1): 12, ("u", 0): 5}
    assert errors.trained_through(offsets) == {("t", 0): 40, ("t", 1): 7, ("u", 0): 5}


class _HeldThenNonFinite(TrainStep):
    """The model raises on every sample of the first batch; every later step has a non-finite loss."""

    def __call__(self, batch, pulled, dense_sync=None, *, plan=None):  # type: ignore[no-untyped-def, override]
        first = not getattr(self, "stepped", False)
        self.stepped = True
        nan = torch.tensor(float("nan"))
        result = self._skip(
            "model_error" if first else "nonfinite_loss",
            timer=StageTimer(self.device, self.sync_timings),
            batch=batch,
            loss=nan,
            logits=torch.full((batch.size,), float("nan")),
            dense_sync=dense_sync,
        )
        if first:
            rows = ModelErrorRows(np.arange(batch.size, dtype=np.int64), "ValueError: odd")
            result = dataclasses.replace(result, model_errors=(rows,))
        return result


def test_a_checkpoint_written_while_a_batch_is_held_covers_nothing_from_it_on(tmp_path: Path) -> None:
    cfg = base_config(tmp_path)
    cfg.batching.batch_size = 1000
    cfg.metrics.enabled = False
    daemon = TrainDaemon(cfg, step_class=_HeldThenNonFinite)
    report = daemon.run()  # the file ends: drained, and a final checkpoint written
    assert report.stopped_by == "source exhausted" and report.checkpoint is not None
    assert daemon.pipeline is not None and daemon.pipeline.model_errors.held == 1
    info = load_latest(cfg.trainer.checkpoint_dir, build_model(cfg.features, cfg.trainer))
    assert info is not None and info.step == 2
    assert list(info.offsets.values()) == [0]  # the held first batch starts the file: nothing past it


def test_a_dead_lettered_sample_is_a_message_that_decodes_back_to_it() -> None:
    batch = _batch(3)
    chunk = Decoder(SPEC).decode([Rec("dlq", 0, 0, encode_row(batch, 2, SPEC))])
    assert not chunk.rejections
    assert chunk.labels.tolist() == [0.0] and chunk.dense.tolist() == [[2.0]]
    assert chunk.values["user"].tolist() == [102]


def _produce(broker: KafkaBroker, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    for value in values:
        producer.send(topic, value, partition=0)
    producer.flush()
    producer.close()


def _committed(broker: KafkaBroker, group: str, topic: str) -> int | None:
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return consumer.committed(TopicPartition(topic, 0))
    finally:
        consumer.close()


def _letters(broker: KafkaBroker, topic: str) -> list[tuple[bytes, dict[str, str]]]:
    return [(r.value, {k: v.decode() for k, v in r.headers}) for r in read_topic(broker.bootstrap, topic)]


def _config(tmp_path: Path, broker: KafkaBroker, topic: str, redis_url: str, model: str) -> KelpConfig:
    for name in (topic, f"{topic}-dlq"):
        broker.create_topic(name, partitions=1)
    cfg = on_kafka(base_config(tmp_path, model=model, model_args={}), broker, topic, redis_url)
    cfg.source.dead_letter_topic = f"{topic}-dlq"  # type: ignore[union-attr]
    cfg.features = SPEC
    cfg.batching.batch_size = 16
    cfg.batching.max_batch_delay_ms = 100
    cfg.metrics.enabled = False
    return cfg


@pytest.mark.integration
def test_the_sample_a_plugin_model_raises_on_is_dead_lettered_and_the_others_trained_and_committed(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS))
    topic = f"odd-{time.monotonic_ns()}"
    cfg = _config(tmp_path, kafka_broker, topic, redis_url, "tiny_models:raises_on_marked")
    odd = 77
    values = [
        encode_sample(i % 2, dense=[MARKER if i == odd else float(i % 5)], sparse={"user": i})
        for i in range(200)
    ]
    _produce(kafka_broker, topic, values)

    running = Running(TrainDaemon(cfg))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and running.error is None:
        if (_committed(kafka_broker, cfg.source.group_id, topic) or 0) >= 200:  # type: ignore[union-attr]
            break
        time.sleep(0.5)
    report = running.stop()
    assert _committed(kafka_broker, cfg.source.group_id, topic) == 200  # type: ignore[union-attr]
    assert report.samples == 199  # every sample but the odd one trained

    (letter,) = _letters(kafka_broker, f"{topic}-dlq")
    value, headers = letter
    assert headers["reason"] == "model_error"
    assert headers["error"].startswith("ValueError: cannot score a sample with dense value 12345.0")
    assert headers["source_topic"] == topic and headers["source_partition"] == "0"
    first, last = (int(x) for x in headers["source_offsets"].rsplit(":", 1)[1].split("-"))
    assert first <= odd <= last
    sample = msgpack.unpackb(value)
    assert sample["dense"] == [MARKER] and sample["sparse"] == {"user": [odd]}
    assert report.summary is not None
    assert "records rejected: model_error 1" in report.summary.lines()


@pytest.mark.integration
def test_kelp_train_with_a_model_that_always_raises_exits_1_with_one_line_committing_nothing(
    tmp_path: Path, kafka_broker: KafkaBroker, redis_url: str
) -> None:
    topic = f"broken-{time.monotonic_ns()}"
    cfg = _config(tmp_path, kafka_broker, topic, redis_url, "tiny_models:always_raises")
    cfg.batching.batch_size = 4
    _produce(kafka_broker, topic, [encode_sample(i % 2, dense=[1.0], sparse={"user": i}) for i in range(40)])
    config = write_config(cfg, tmp_path / "kelp.yaml")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLUGINS), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-m", "kelp.cli", "train", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("kelp: error:")]
    assert "the model raised on every sample of 3 batch(es) in a row" in line
    assert "RuntimeError: model is broken" in line
    assert _committed(kafka_broker, cfg.source.group_id, topic) is None  # type: ignore[union-attr]
    assert _letters(kafka_broker, f"{topic}-dlq") == []
