"""Bad requests get a 4xx with a reason, never a 5xx (limits from helpers.small_config)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Live

pytestmark = pytest.mark.integration

CASES: list[tuple[str, Any, int, str]] = [
    ("not_json", b"{not json", 422, "bad_json"),
    ("no_samples_field", {}, 422, "invalid_request"),
    ("empty_samples", {"samples": []}, 422, "invalid_request"),
    ("samples_not_a_list", {"samples": {"dense": {}}}, 422, "invalid_request"),
    ("too_many_samples", {"samples": [{}] * 65}, 413, "too_many_samples"),
    ("dense_string", {"samples": [{"dense": {"I1": "3.0"}}]}, 422, "bad_dense"),
    ("dense_bool", {"samples": [{"dense": {"I1": True}}]}, 422, "bad_dense"),
    ("dense_nan_literal", b'{"samples": [{"dense": {"I1": NaN}}]}', 422, "bad_dense"),
    ("dense_overflows_float32", {"samples": [{"dense": {"I2": 1e300}}]}, 422, "bad_dense"),
    ("dense_log1p_of_minus_two", {"samples": [{"dense": {"I1": -2.0}}]}, 422, "bad_dense"),
    ("unknown_dense", {"samples": [{"dense": {"I9": 1.0}}]}, 422, "unknown_feature"),
    ("unknown_sparse", {"samples": [{"sparse": {"C9": 1}}]}, 422, "unknown_feature"),
    ("unknown_top_level", {"samples": [{}], "model": "x"}, 422, "invalid_request"),
    ("negative_id", {"samples": [{"sparse": {"C1": -1}}]}, 422, "bad_id"),
    ("id_too_large", {"samples": [{"sparse": {"C1": 2**64}}]}, 422, "bad_id"),
    ("float_id", {"samples": [{"sparse": {"C1": 1.0}}]}, 422, "bad_id"),
    ("object_id", {"samples": [{"sparse": {"C1": {"id": "abc"}}}]}, 422, "bad_id"),
    ("lone_surrogate_id", b'{"samples": [{"sparse": {"C1": "\\ud800"}}]}', 422, "bad_id"),
    ("too_many_ids_for_feature", {"samples": [{"sparse": {"C1": [1, 2]}}]}, 422, "too_many_ids"),
    ("too_many_ids_for_serving", {"samples": [{"sparse": {"C2": [1, 2, 3, 4]}}]}, 422, "too_many_ids"),
    ("candidates_missing", {"user": {}}, 422, "invalid_request"),
]


@pytest.mark.parametrize(("body", "status", "reason"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_score_requests(live: Live, body: Any, status: int, reason: str) -> None:
    path = "/v1/score/candidates" if isinstance(body, dict) and "user" in body else "/v1/score"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = live.client.post(path, content=content, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"] == reason
    assert r.json()["detail"]


def test_body_over_the_limit_is_413_before_parsing(live: Live) -> None:
    big = json.dumps({"samples": [{"sparse": {"C3": 1}}] * 5000}).encode()
    assert len(big) > live.cfg.serving.max_body_bytes
    r = live.client.post("/v1/score", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"


def test_chunked_body_over_the_limit_is_413(live: Live) -> None:
    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"samples": ['
        for _ in range(3000):
            yield b'{"sparse": {"C3": 1}},'
        yield b"{}]}"

    r = live.client.post("/v1/score", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"


def test_largest_allowed_values_are_accepted(live: Live) -> None:
    body = {"samples": [{"sparse": {"C1": 2**64 - 1, "C2": [0, 1, 2], "C3": 0}, "dense": {"I1": 0}}] * 64}
    r = live.client.post("/v1/score", json=body)
    assert r.status_code == 200 and len(r.json()["scores"]) == 64


def test_missing_features_use_the_event_schema_defaults(live: Live) -> None:
    """Absent/null dense -> the feature's default; absent/empty sparse -> no ids. Same score either way."""
    explicit = {"dense": {"I1": 0.0, "I2": 1.5}, "sparse": {"C1": [], "C2": [], "C3": []}}
    implicit = {"dense": {"I2": None}}
    out = live.client.post("/v1/score", json={"samples": [explicit, implicit, {}]}).json()
    assert len(set(out["scores"])) == 1


def test_unknown_path_and_method(live: Live) -> None:
    assert live.client.get("/v1/nope").status_code == 404
    assert live.client.get("/v1/score").status_code == 405
