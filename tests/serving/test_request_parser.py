"""The request checks agree with the OpenAPI request models, without building them per request.

The endpoints check bodies with :class:`~kelp.serving.features.RequestParser`
(no pydantic objects on the hot path); the generated pydantic models remain the
published contract. Every body here must be accepted or refused by both alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from pydantic import ValidationError

from kelp.serving.body import decode_body
from kelp.serving.errors import RequestError
from kelp.serving.features import RequestParser
from kelp.serving.schemas import build_request_models

from .helpers import small_config
from .test_validation import CASES

ACCEPTED: list[dict[str, Any]] = [
    {"samples": [{}]},
    {"samples": [{"dense": {"I1": 0, "I2": None}, "sparse": {"C1": 2**64 - 1, "C2": [0, 1, 2], "C3": None}}]},
    {"samples": [{"sparse": {"C2": []}}] * 64},
    {"user": {"sparse": {"C3": 9}}, "candidates": [{}, {"sparse": {"C1": 4}}]},
    {"candidates": {"count": 2, "sparse": {"C1": [1, 2], "C2": {"values": [3, 4, 5], "lengths": [2, 1]}}}},
    {"candidates": {"count": 1, "dense": {"I2": [0.5]}}},
    {"samples": [{"sparse": {"C1": "258029", "C2": ["alice", 3, "007"], "C3": ""}}]},
    {"user": {"sparse": {"C3": "u1"}}, "candidates": [{"sparse": {"C1": "a"}}, {"sparse": {"C1": 4}}]},
    {
        "candidates": {
            "count": 2,
            "sparse": {"C1": ["1", 2], "C2": {"values": ["x", 4, "5"], "lengths": [2, 1]}},
        }
    },
]
REFUSED: list[dict[str, Any]] = [
    {"candidates": {"count": 0}},
    {"candidates": {"count": 65}},
    {"candidates": {"count": 2, "sparse": {"C9": [1, 2]}}},
    {"candidates": {"count": 2, "sparse": {"C1": [1, -2]}}},
    {"candidates": {"count": 1, "sparse": {"C2": {"values": [1, 2, 3, 4], "lengths": [4]}}}},
    {"candidates": {"count": 1, "dense": {"I1": ["x"]}}},
    {"candidates": {"count": 1}, "extra": 1},
    {"samples": [{"dense": None}]},
    {"samples": [{"sparse": {"C1": True}}]},
    {"samples": [{"sparse": {"C1": [1.0]}}]},
    {"samples": [{"other": {}}]},
    {"samples": [7]},
]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple[RequestParser, Any]:
    cfg = small_config("redis://127.0.0.1:1", Path(tmp_path_factory.mktemp("cfg")))
    return RequestParser(cfg.features, cfg.serving), build_request_models(cfg.features, cfg.serving)


def _parse(parser: RequestParser, body: Any) -> bool:
    try:
        (parser.candidates if "candidates" in body or "user" in body else parser.samples)(body)
    except RequestError:
        return False
    return True


def _model_accepts(models: Any, body: Any) -> bool:
    model = models.candidates if "candidates" in body or "user" in body else models.score
    try:
        model.model_validate(body)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("body", ACCEPTED, ids=range(len(ACCEPTED)))
def test_valid_bodies_are_accepted_by_both(parts, body: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    parser, models = parts
    assert _model_accepts(models, body)
    assert _parse(parser, body)


# Refused only after the float32 cast or the transforms, which a JSON schema cannot express.
AFTER_TRANSFORMS = {"dense_overflows_float32", "dense_log1p_of_minus_two"}


@pytest.mark.parametrize(
    "body", REFUSED + [c[1] for c in CASES if isinstance(c[1], dict) and c[0] not in AFTER_TRANSFORMS]
)
def test_invalid_bodies_are_refused_by_both(parts, body: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    parser, models = parts
    assert not _model_accepts(models, body)
    assert not _parse(parser, body)


def test_columnar_and_row_candidates_build_the_same_batch(parts) -> None:  # type: ignore[no-untyped-def]
    parser, _ = parts
    user = {"dense": {"I1": 2.0}, "sparse": {"C1": 1, "C2": [2, 3], "C3": 9}}
    rows = [{"sparse": {"C1": 4, "C2": [5]}}, {"sparse": {"C1": 6, "C2": [7, 8]}, "dense": {"I2": 0.5}}]
    columns = {
        "count": 2,
        "dense": {"I2": np.array([1.5, 0.5], "<f4").tobytes()},
        "sparse": {
            "C1": np.array([4, 6], "<u8").tobytes(),
            "C2": {"values": np.array([5, 7, 8], "<u8").tobytes(), "lengths": [1, 2]},
        },
    }
    a = parser.candidates({"user": user, "candidates": rows})
    b = parser.candidates(
        decode_body(msgpack.packb({"user": user, "candidates": columns}), "application/msgpack")
    )
    np.testing.assert_array_equal(a.dense, b.dense)
    for table in a.tables:
        np.testing.assert_array_equal(a.tables[table].unique_ids, b.tables[table].unique_ids)
    for name in ("C1", "C2", "C3"):
        np.testing.assert_array_equal(a.sparse[name].values, b.sparse[name].values)
        np.testing.assert_array_equal(a.sparse[name].offsets, b.sparse[name].offsets)


@pytest.mark.parametrize(
    ("raw", "content_type", "reason"),
    [
        (b"{not json", "application/json", "bad_json"),
        (b"[" * 5000 + b"]" * 5000, "application/json", "bad_json"),
        (b"\xc1", "application/msgpack", "bad_msgpack"),
        (msgpack.packb({1: 2}), "application/msgpack", "bad_msgpack"),
    ],
    ids=["broken_json", "deeply_nested_json", "broken_msgpack", "non_string_map_key"],
)
def test_undecodable_bodies_name_their_format(raw: bytes, content_type: str, reason: str) -> None:
    with pytest.raises(RequestError) as info:
        decode_body(raw, content_type)
    assert info.value.reason == reason and info.value.status == 422


def _same_batch(a: Any, b: Any) -> None:
    np.testing.assert_array_equal(a.dense, b.dense)
    assert list(a.sparse) == list(b.sparse)
    for name in a.sparse:
        np.testing.assert_array_equal(a.sparse[name].values, b.sparse[name].values)
        np.testing.assert_array_equal(a.sparse[name].offsets, b.sparse[name].offsets)


@pytest.mark.parametrize("given", [("C3", "C1"), ("C3",), ("C2",)])
def test_uniform_candidates_build_the_per_candidate_batch(parts, given: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    """The bulk path (every candidate one id per feature, same names) equals the per-candidate one.

    Features the candidates do not give are the user's: one id, a list, or none. An empty
    ``dense`` object changes nothing in the batch but sends the body down the per-candidate
    path, so the two results can be compared.
    """
    parser, _ = parts
    user = {"dense": {"I1": 2.0}, "sparse": {"C1": 1, "C2": [2, 3]}}
    rows = [{"sparse": {name: 2**64 - 1 - k - j for j, name in enumerate(given)}} for k in range(5)]
    bulk = parser.candidates({"user": user, "candidates": rows})
    assert parser._uniform_ids(rows) is not None
    slow_rows = [*rows[:-1], {**rows[-1], "dense": {}}]
    assert parser._uniform_ids(slow_rows) is None
    _same_batch(bulk, parser.candidates({"user": user, "candidates": slow_rows}))


@pytest.mark.parametrize(
    ("bad", "reason"),
    [(-1, "bad_id"), (2**64, "bad_id"), (True, "bad_id"), (1.0, "bad_id"), ({"id": "7"}, "bad_id")],
)
def test_a_bad_id_among_uniform_candidates_keeps_its_reason(parts, bad: Any, reason: str) -> None:  # type: ignore[no-untyped-def]
    parser, _ = parts
    rows = [{"sparse": {"C1": 1, "C3": 2}} for _ in range(4)]
    rows[2] = {"sparse": {"C1": 1, "C3": bad}}
    with pytest.raises(RequestError) as info:
        parser.candidates({"candidates": rows})
    assert info.value.reason == reason and "candidates[2].sparse.C3" in str(info.value)


def test_an_unknown_feature_among_uniform_candidates_is_named(parts) -> None:  # type: ignore[no-untyped-def]
    parser, _ = parts
    rows = [{"sparse": {"C1": 1, "C9": 2}} for _ in range(3)]
    with pytest.raises(RequestError) as info:
        parser.candidates({"candidates": rows})
    assert info.value.reason == "unknown_feature" and "C9" in str(info.value)
