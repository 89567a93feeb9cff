"""Hostile numbers in score bodies get a 4xx naming the field, never a 5xx (a real replica under uvicorn).

Every numeric path of :mod:`kelp.serving.features` and :mod:`kelp.serving.body`:
dense values, one id, id lists, the user's features, uniform row candidates,
columnar candidates (values, ids, jagged lengths and values, the count), over
JSON and msgpack. The numbers are the ones a parser or a numpy conversion
chokes on: integers past float range, past uint64 and int64, past Python's
digit limit, negative, booleans, ``1e400`` (infinity), NaN, and nested lists.
Limits are helpers.small_config's (I1 has a log1p transform, C2 takes lists).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgpack
import pytest

from .conftest import Live

pytestmark = pytest.mark.integration

BIG = "1" + "0" * 400  # past float64 (about 1.8e308) and any fixed-width integer
HUGE = "1" + "0" * 5000  # past Python's int digit limit (4300) for str -> int
U64_OVER = str(2**64)
I64_UNDER = str(-(2**63) - 1)


class Case(NamedTuple):
    name: str
    path: str
    body: Any  # raw JSON text, or what msgpack packs
    status: int
    reason: str
    where: str  # what the error's detail must name: the field (and sample) at fault


def _n(template: str, number: str) -> str:
    """A JSON body with ``number`` written where ``template`` has ``#``."""
    return template.replace("#", number)


JSON_CASES = [Case(*c) for c in [
    ("dense_int_past_float", "/v1/score", _n('{"samples":[{"dense":{"I1":#}}]}', BIG), 422, "bad_dense",
     "samples[0].dense.I1"),
    ("dense_negative_int_past_float", "/v1/score", _n('{"samples":[{}, {"dense":{"I2":-#}}]}', BIG), 422,
     "bad_dense", "samples[1].dense.I2"),
    ("dense_int_past_digit_limit", "/v1/score", _n('{"samples":[{"dense":{"I1":#}}]}', HUGE), 422,
     "bad_dense", "samples[0].dense.I1"),
    ("dense_1e400", "/v1/score", '{"samples":[{"dense":{"I1":1e400}}]}', 422, "bad_dense",
     "samples[0].dense.I1"),
    ("dense_minus_1e400", "/v1/score", '{"samples":[{"dense":{"I2":-1e400}}]}', 422, "bad_dense",
     "samples[0].dense.I2"),
    ("dense_infinity_literal", "/v1/score", '{"samples":[{"dense":{"I1":Infinity}}]}', 422, "bad_dense",
     "samples[0].dense.I1"),
    ("dense_bool", "/v1/score", '{"samples":[{"dense":{"I2":false}}]}', 422, "bad_dense",
     "samples[0].dense.I2"),
    ("dense_nested_list", "/v1/score", '{"samples":[{"dense":{"I1":[[1.0]]}}]}', 422, "bad_dense",
     "samples[0].dense.I1"),
    ("dense_fits_f64_not_f32", "/v1/score", _n('{"samples":[{"dense":{"I2":#}}]}', ("1" + "0" * 300)), 422,
     "bad_dense", "'I2'"),
    ("id_past_u64", "/v1/score", _n('{"samples":[{"sparse":{"C1":#}}]}', U64_OVER), 422, "bad_id",
     "samples[0].sparse.C1"),
    ("id_past_float", "/v1/score", _n('{"samples":[{"sparse":{"C3":#}}]}', BIG), 422, "bad_id",
     "samples[0].sparse.C3"),
    ("id_past_digit_limit", "/v1/score", _n('{"samples":[{"sparse":{"C3":#}}]}', HUGE), 422, "bad_id",
     "samples[0].sparse.C3"),
    ("id_below_i64", "/v1/score", _n('{"samples":[{"sparse":{"C1":#}}]}', I64_UNDER), 422, "bad_id",
     "samples[0].sparse.C1"),
    ("id_negative", "/v1/score", '{"samples":[{"sparse":{"C3":-1}}]}', 422, "bad_id", "samples[0].sparse.C3"),
    ("id_bool", "/v1/score", '{"samples":[{"sparse":{"C1":true}}]}', 422, "bad_id", "samples[0].sparse.C1"),
    ("id_1e400", "/v1/score", '{"samples":[{"sparse":{"C1":1e400}}]}', 422, "bad_id", "samples[0].sparse.C1"),
    ("id_float", "/v1/score", '{"samples":[{"sparse":{"C1":3.0}}]}', 422, "bad_id", "samples[0].sparse.C1"),
    ("id_nested_list", "/v1/score", '{"samples":[{"sparse":{"C2":[[1]]}}]}', 422, "bad_id",
     "samples[0].sparse.C2"),
    ("id_list_past_u64", "/v1/score", _n('{"samples":[{"sparse":{"C2":[1, #]}}]}', BIG), 422, "bad_id",
     "samples[0].sparse.C2"),
    ("id_list_bool", "/v1/score", '{"samples":[{"sparse":{"C2":[1, false]}}]}', 422, "bad_id",
     "samples[0].sparse.C2"),
    ("user_dense_past_float", "/v1/score/candidates",
     _n('{"user":{"dense":{"I1":#}},"candidates":[{}]}', BIG), 422, "bad_dense", "user.dense.I1"),
    ("user_id_past_u64", "/v1/score/candidates",
     _n('{"user":{"sparse":{"C3":#}},"candidates":[{"sparse":{"C1":1}}]}', U64_OVER), 422, "bad_id",
     "user.sparse.C3"),
    ("uniform_candidates_id_past_u64", "/v1/score/candidates",
     _n('{"candidates":[{"sparse":{"C1":1}},{"sparse":{"C1":#}}]}', U64_OVER), 422, "bad_id",
     "candidates[1].sparse.C1"),
    ("uniform_candidates_negative_id", "/v1/score/candidates",
     '{"candidates":[{"sparse":{"C1":-5}},{"sparse":{"C1":1}}]}', 422, "bad_id", "candidates[0].sparse.C1"),
    ("row_candidate_dense_past_float", "/v1/score/candidates",
     _n('{"candidates":[{},{"dense":{"I2":#}}]}', BIG), 422, "bad_dense", "candidates[1].dense.I2"),
    ("columnar_count_past_float", "/v1/score/candidates", _n('{"candidates":{"count":#}}', BIG), 413,
     "too_many_samples", "serving.max_samples_per_request"),
    ("columnar_count_past_digit_limit", "/v1/score/candidates", _n('{"candidates":{"count":#}}', HUGE), 422,
     "invalid_request", "candidates.count"),
    ("columnar_count_bool", "/v1/score/candidates", '{"candidates":{"count":true}}', 422, "invalid_request",
     "candidates.count"),
    ("columnar_dense_past_float", "/v1/score/candidates",
     _n('{"candidates":{"count":2,"dense":{"I2":[1.0, #]}}}', BIG), 422, "bad_dense", "candidates.dense.I2"),
    ("columnar_dense_1e400", "/v1/score/candidates",
     '{"candidates":{"count":1,"dense":{"I2":[1e400]}}}', 422, "bad_dense", "candidates.dense.I2"),
    ("columnar_ids_past_u64", "/v1/score/candidates",
     _n('{"candidates":{"count":1,"sparse":{"C1":[#]}}}', BIG), 422, "bad_id", "candidates.sparse.C1"),
    ("columnar_ids_negative", "/v1/score/candidates",
     '{"candidates":{"count":1,"sparse":{"C1":[-1]}}}', 422, "bad_id", "candidates.sparse.C1"),
    ("columnar_ids_nested", "/v1/score/candidates",
     '{"candidates":{"count":1,"sparse":{"C1":[[1]]}}}', 422, "bad_id", "candidates.sparse.C1"),
    ("jagged_length_past_i64", "/v1/score/candidates",
     _n('{"candidates":{"count":1,"sparse":{"C2":{"values":[1],"lengths":[#]}}}}', BIG), 422, "bad_id",
     "candidates.sparse.C2.lengths"),
    ("jagged_length_below_i64", "/v1/score/candidates",
     _n('{"candidates":{"count":1,"sparse":{"C2":{"values":[1],"lengths":[-#]}}}}', BIG), 422, "bad_id",
     "candidates.sparse.C2.lengths"),
    ("jagged_length_past_u32", "/v1/score/candidates",
     '{"candidates":{"count":1,"sparse":{"C2":{"values":[1],"lengths":[4294967297]}}}}', 422,
     "too_many_ids", "candidates.sparse.C2"),
    ("jagged_length_float", "/v1/score/candidates",
     '{"candidates":{"count":1,"sparse":{"C2":{"values":[1],"lengths":[1e400]}}}}', 422, "bad_id",
     "candidates.sparse.C2.lengths"),
    ("jagged_value_past_u64", "/v1/score/candidates",
     _n('{"candidates":{"count":1,"sparse":{"C2":{"values":[#],"lengths":[1]}}}}', U64_OVER), 422, "bad_id",
     "candidates.sparse.C2"),
]]  # fmt: skip

_PACKED_NAN = b"\x00\x00\xc0\x7f"  # one float32 NaN
MSGPACK_CASES = [Case(*c) for c in [
    ("mp_dense_nan", "/v1/score", {"samples": [{"dense": {"I2": float("nan")}}]}, 422, "bad_dense",
     "samples[0].dense.I2"),
    ("mp_dense_inf", "/v1/score", {"samples": [{"dense": {"I2": float("inf")}}]}, 422, "bad_dense",
     "samples[0].dense.I2"),
    ("mp_dense_bytes", "/v1/score", {"samples": [{"dense": {"I2": b"\x00" * 4}}]}, 422, "bad_dense",
     "samples[0].dense.I2"),
    ("mp_dense_ext", "/v1/score", {"samples": [{"dense": {"I2": msgpack.ExtType(1, b"x")}}]}, 422,
     "bad_dense", "samples[0].dense.I2"),
    ("mp_id_int64_min", "/v1/score", {"samples": [{"sparse": {"C1": -(2**63)}}]}, 422, "bad_id",
     "samples[0].sparse.C1"),
    ("mp_id_bool", "/v1/score", {"samples": [{"sparse": {"C1": True}}]}, 422, "bad_id",
     "samples[0].sparse.C1"),
    ("mp_id_float", "/v1/score", {"samples": [{"sparse": {"C3": 1.5}}]}, 422, "bad_id",
     "samples[0].sparse.C3"),
    ("mp_packed_dense_nan", "/v1/score/candidates",
     {"candidates": {"count": 1, "dense": {"I2": _PACKED_NAN}}}, 422, "bad_dense", "'I2'"),
    ("mp_packed_lengths_negative", "/v1/score/candidates",
     {"candidates": {"count": 1, "sparse": {"C2": {"values": b"", "lengths": b"\xff\xff\xff\xff"}}}}, 422,
     "bad_id", "candidates.sparse.C2.lengths"),
    ("mp_packed_lengths_int32_max", "/v1/score/candidates",
     {"candidates": {"count": 1, "sparse": {"C2": {"values": b"", "lengths": b"\xff\xff\xff\x7f"}}}}, 422,
     "too_many_ids", "candidates.sparse.C2"),
    ("mp_columnar_count_u64_max", "/v1/score/candidates", {"candidates": {"count": 2**64 - 1}}, 413,
     "too_many_samples", "serving.max_samples_per_request"),
]]  # fmt: skip


def _assert_refused(r: Any, case: Case) -> None:
    assert 400 <= r.status_code < 500, r.text
    assert (r.status_code, r.headers["content-type"]) == (case.status, "application/json"), r.text
    payload = r.json()
    assert set(payload) == {"error", "detail"}, payload
    assert payload["error"] == case.reason, payload
    assert isinstance(payload["detail"], str) and case.where in payload["detail"], payload
    assert len(payload["detail"]) < 200, "a refused value is named, not echoed back in full"


@pytest.mark.parametrize("case", JSON_CASES, ids=[c.name for c in JSON_CASES])
def test_hostile_json_numbers_are_4xx(live: Live, case: Case) -> None:
    r = live.client.post(case.path, content=case.body.encode(), headers={"content-type": "application/json"})
    _assert_refused(r, case)


@pytest.mark.parametrize("case", MSGPACK_CASES, ids=[c.name for c in MSGPACK_CASES])
def test_hostile_msgpack_numbers_are_4xx(live: Live, case: Case) -> None:
    raw = msgpack.packb(case.body, use_bin_type=True)
    r = live.client.post(case.path, content=raw, headers={"content-type": "application/msgpack"})
    _assert_refused(r, case)


def test_the_replica_still_scores_after_them(live: Live) -> None:
    """The refusals leave nothing behind: the next good request is scored, and none was a 5xx."""
    for case in JSON_CASES:
        live.client.post(case.path, content=case.body.encode(), headers={"content-type": "application/json"})
    sample = {"dense": {"I1": 2**53}, "sparse": {"C1": 2**64 - 1}}
    r = live.client.post("/v1/score", json={"samples": [sample]})
    assert r.status_code == 200, r.text
    answered = [
        line for line in live.client.get("/metrics").text.splitlines()
        if line.startswith("kelp_serving_requests_total{")
    ]  # fmt: skip
    assert answered and not [line for line in answered if 'status="5' in line], answered
