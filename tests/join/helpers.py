"""Shared pieces of the join's integration tests: a config, inputs on real topics, the output read back."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import orjson
import yaml
from kafka import KafkaProducer

from kelp.config import KelpConfig, parse_config
from kelp.consumers.codec import encode_request_record
from kelp.harness.ports import free_port
from kelp.harness.topic_reader import read_topic

T0 = 1_700_000_000.0
ITEMS = [101, 102, 103]
HEARTBEAT = "heartbeat"


def join_config_dict(bootstrap: str, redis_url: str, topics: dict[str, str], **join: Any) -> dict[str, Any]:
    """A config for ``kelp join``: one click task, candidates named by ``item``."""
    return {
        "deployment": topics.get("deployment", "jt"),
        "features": {
            "label": {"name": "click"},
            "dense": [{"name": "price"}],
            "sparse": [{"name": "user"}, {"name": "item"}],
        },
        "source": {"kind": "kafka", "bootstrap_servers": [bootstrap], "topics": [topics["out"]]},
        "store": {"backend": "redis", "urls": [redis_url]},
        "publisher": {"enabled": False},
        "join": {
            "impressions_topic": topics["imp"],
            "actions": [{"topic": topics["clicks"], "task": "click", "window_s": 60, "item_field": "item"}],
            "item_feature": "item",
            "group_id": topics.get("group", "join-test"),
            "allowed_lateness_s": 0,
            "advance_when_idle": False,
            "dead_letter_topic": topics["dlq"],
            "port": free_port(),
            **join,
        },
    }


def join_config(bootstrap: str, redis_url: str, topics: dict[str, str], **join: Any) -> KelpConfig:
    return parse_config(join_config_dict(bootstrap, redis_url, topics, **join), origin="test")


def write_config(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


def impression(rid: str, ts: float, items: list[int] = ITEMS) -> bytes:
    n = len(items)
    return encode_request_record(
        request_id=rid,
        model_version=1,
        ts=ts,
        dense=np.full((n, 1), 2.5, dtype=np.float32),
        sparse={
            "user": (np.full(n, 9, dtype=np.uint64), np.ones(n, dtype=np.int32)),
            "item": (np.array(items, dtype=np.uint64), np.ones(n, dtype=np.int32)),
        },
        scores={"click": np.full(n, 0.5, dtype=np.float32)},
    )


def click(rid: str, ts: float, item: int) -> bytes:
    return orjson.dumps({"request_id": rid, "ts": ts, "item": item})


def produce(bootstrap: str, topic: str, values: list[tuple[str, bytes]]) -> None:
    """Send ``(key, value)`` pairs to ``topic`` and wait for every ack."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for key, value in values:
            producer.send(topic, key=key.encode(), value=value)
        producer.flush(30)
    finally:
        producer.close()


def read_output(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every sample on ``topic`` when called (one dict per candidate)."""
    return [sample for record in read_topic(bootstrap, topic) for sample in samples_of(record.value)]


def samples_of(value: bytes) -> list[dict[str, Any]]:
    msg = msgpack.unpackb(value)
    click_col = np.frombuffer(msg["labels"]["click"], "<f4")
    return [
        {"id": sid, "click": float(click_col[i]), "late": msg["join"]["late"]}
        for i, sid in enumerate(msg["join"]["sample_ids"])
    ]


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
