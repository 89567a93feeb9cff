"""Schema-v1 codec and validation: every reason, columnar partial rejection, transforms."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kelp.config import DenseFeature, FeatureSpec, LabelSpec, SparseFeature
from kelp.consumers.codec import encode_columns, encode_sample, hash_str_id
from kelp.consumers.decode import Decoder, Rec
from kelp.consumers.ids import id_of

SPEC = FeatureSpec(
    dense=[DenseFeature(name="x", default=2.0, transforms=["log1p"]), DenseFeature(name="y")],
    sparse=[SparseFeature(name="a"), SparseFeature(name="b", max_ids=3, table="a")],
)


def decode(values: list[bytes], spec: FeatureSpec = SPEC, max_bytes: int | None = 10_000):  # type: ignore[no-untyped-def]
    return Decoder(spec, max_bytes).decode([Rec("t", 0, i, v) for i, v in enumerate(values)])


def test_single_sample_fields_defaults_and_hashing() -> None:
    c = decode(
        [
            encode_sample(1, {"y": 3.0}, {"a": 5, "b": ["s", 6]}, ts=10.0),
            encode_sample(0, [1.0, 2.0], {}),
        ]
    )
    assert c.size == 2 and not c.rejections
    np.testing.assert_allclose(c.dense, [[math.log1p(2.0), 3.0], [math.log1p(1.0), 2.0]], rtol=1e-6)
    assert c.values["b"].tolist() == [hash_str_id("s"), 6]
    assert c.lengths["a"].tolist() == [1, 0] and c.lengths["b"].tolist() == [2, 0]
    assert c.ts[0] == 10.0 and math.isnan(c.ts[1])


BAD = {
    "bad_msgpack": b"\xc1\x00",
    "bad_version": msgpack.packb({"v": 2, "label": 1}),
    "missing_label": msgpack.packb({"v": 1}),
    "bad_label": encode_sample(0.5),
    "bad_dense": encode_sample(1, {"y": float("inf")}),
    "unknown_feature": encode_sample(1, {"zzz": 1.0}),
    "bad_type": encode_sample("yes"),  # type: ignore[arg-type]
    "too_many_ids": encode_sample(1, sparse={"b": [1, 2, 3, 4]}),
    "bad_id": encode_sample(1, sparse={"a": -3}),
    "oversize": encode_sample(1, sparse={"a": "x" * 20_000}),
    "bad_shape": encode_sample(1, [1.0, 2.0, 3.0]),
}


@pytest.mark.parametrize("reason", sorted(BAD))
def test_each_reason_rejects_only_the_bad_record(reason: str) -> None:
    good = encode_sample(1, {"x": 1.0}, {"a": 1})
    c = decode([good, BAD[reason], good])
    assert c.size == 2
    assert [(r.reason, r.offset) for r in c.rejections] == [(reason, 1)]
    assert c.rejections[0].value == BAD[reason]
    assert c.row_offsets.tolist() == [0, 2]


def test_float_label_kind_accepts_any_finite() -> None:
    spec = SPEC.model_copy(update={"label": LabelSpec(kind="float")})
    c = decode([encode_sample(0.5), encode_sample(float("nan"))], spec)
    assert c.labels.tolist() == [0.5] and c.rejections[0].reason == "bad_label"


def test_columnar_rejects_only_bad_rows() -> None:
    msg = encode_columns(
        labels=np.array([1, 0, 3, 1]),
        dense=np.array([[1, 2], [np.nan, 0], [0, 0], [1, 1]]),
        sparse={"a": np.array([1, 2, 3, 4], dtype=np.uint64), "b": (np.arange(7), np.array([1, 1, 1, 4]))},
        packed=False,
    )
    c = decode([msg])
    assert c.size == 1 and c.values["a"].tolist() == [1]
    assert sorted((r.reason, r.rows) for r in c.rejections) == [
        ("bad_dense", 1),
        ("bad_label", 1),
        ("too_many_ids", 1),
    ]


def test_columnar_structural_error_rejects_message() -> None:
    raw = msgpack.packb({"v": 1, "batch": 3, "label": [1, 0]})
    c = decode([raw, encode_sample(1)])
    assert c.size == 1 and c.rejections[0].reason == "bad_shape" and c.rejections[0].rows == 3


def test_mixed_single_and_columnar_keep_record_order() -> None:
    col = encode_columns(np.array([1.0, 0.0]), sparse={"a": np.array([10, 11], dtype=np.uint64)})
    c = decode([encode_sample(1, sparse={"a": 1}), col, encode_sample(0, sparse={"a": 2})])
    assert c.row_offsets.tolist() == [0, 1, 1, 2]
    assert c.values["a"].tolist() == [1, 10, 11, 2]


@given(
    st.lists(
        st.tuples(
            st.sampled_from([0.0, 1.0]),
            st.floats(0, 1e6),
            st.lists(st.one_of(st.integers(0, 2**64 - 1), st.text(max_size=5)), max_size=3),
        ),
        min_size=1,
        max_size=20,
    ),
    st.booleans(),
)
def test_columnar_and_single_round_trip_agree(rows, packed: bool) -> None:  # type: ignore[no-untyped-def]
    labels = np.array([r[0] for r in rows])
    ys = np.array([r[1] for r in rows])
    ids = [[id_of(i) for i in r[2]] for r in rows]  # a digit string is its integer, other text hashed
    flat = np.array([i for x in ids for i in x], dtype=np.uint64)
    lengths = np.array([len(x) for x in ids])
    col = decode([encode_columns(labels, {"y": ys}, {"b": (flat, lengths)}, packed=packed)], max_bytes=None)
    single = decode([encode_sample(r[0], {"y": r[1]}, {"b": r[2]}) for r in rows], max_bytes=None)
    for c in (col, single):
        assert not c.rejections
        np.testing.assert_array_equal(c.labels, labels.astype(np.float32))
        np.testing.assert_array_equal(c.values["b"], flat)
        np.testing.assert_array_equal(c.lengths["b"], lengths)
        np.testing.assert_allclose(c.dense[:, 1], ys.astype(np.float32))


def test_transforms_clip_standardize() -> None:
    spec = FeatureSpec(
        dense=[
            DenseFeature(
                name="x",
                transforms=[
                    {"kind": "clip", "min": 0, "max": 10},
                    {"kind": "standardize", "mean": 5, "std": 5},
                ],
            )
        ]
    )
    c = decode([encode_sample(1, {"x": v}) for v in (-5.0, 5.0, 50.0)], spec)
    np.testing.assert_allclose(c.dense[:, 0], [-1.0, 0.0, 1.0])
