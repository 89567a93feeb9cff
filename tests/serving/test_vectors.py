"""``POST /v1/embeddings`` on a real replica and Redis: stored rows by id, and the encode hook's absence."""

from __future__ import annotations

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from kelp.consumers.ids import str_id
from kelp.store import build_store

from .conftest import Live

pytestmark = pytest.mark.integration


def test_stored_rows_come_back_by_id_in_request_order(live: Live) -> None:
    cfg = live.cfg
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    with build_store(cfg.store, list(cfg.features.tables), cfg.deployment, CollectorRegistry()) as store:
        store.push("ads", np.array([7, 9, str_id("alice")], np.uint64), rows, np.zeros(3, np.float32))
        stats_before = store.pull_many({"ads": np.array([12345], np.uint64)}, count=False)

    reply = live.client.post("/v1/embeddings", json={"table": "ads", "ids": [9, "alice", 12345, "7", 9]})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["table"] == "ads" and body["dim"] == 4
    assert body["ids"] == [9, str_id("alice"), 12345, 7, 9]
    assert body["stored"] == [True, True, False, True, True]
    assert body["vectors"][0] == rows[1].tolist() and body["vectors"][1] == rows[2].tolist()
    assert body["vectors"][3] == rows[0].tolist() and body["vectors"][4] == rows[1].tolist()
    assert body["vectors"][2] == stats_before["ads"].rows[0].tolist()  # what a pull gives an unknown id

    by_feature = live.client.post("/v1/embeddings", json={"feature": "C2", "ids": [7]}).json()
    assert by_feature["table"] == "ads" and by_feature["vectors"] == [rows[0].tolist()]

    # read-only: asking for an id never admits it
    again = live.client.post("/v1/embeddings", json={"table": "ads", "ids": [12345]}).json()
    assert again["stored"] == [False]


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ({"table": "nope", "ids": [1]}, 422, "unknown_table"),
        ({"feature": "I1", "ids": [1]}, 422, "unknown_feature"),
        ({"table": "ads", "feature": "C1", "ids": [1]}, 422, "invalid_request"),
        ({"table": "ads", "ids": []}, 422, "invalid_request"),
        ({"table": "ads", "ids": [-1]}, 422, "bad_id"),
        ({"table": "ads", "ids": list(range(64 * 3 + 1))}, 413, "too_many_ids"),
        ({"samples": [{"sparse": {"C1": 1}}]}, 422, "no_encode_hook"),
        ([1, 2], 422, "invalid_request"),
        ({"table": [], "ids": [1]}, 422, "invalid_request"),
        ({"feature": {"a": 1}, "ids": [1]}, 422, "invalid_request"),
    ],
)
def test_bad_requests_get_a_4xx_with_the_reason(live: Live, body: object, status: int, reason: str) -> None:
    reply = live.client.post("/v1/embeddings", json=body)
    assert reply.status_code == status, reply.text
    assert reply.json()["error"] == reason
