"""Fuzz the msgpack event decoder: every input either decodes or is rejected with a reason.

Hypothesis feeds :class:`~kelp.consumers.decode.Decoder` random bytes,
structurally random msgpack maps shaped like schema-v1 messages (any value in
any field), and valid messages with bytes flipped, cut or inserted, as runs of
several records; each run is decoded twice by the same decoder, so the second
pass goes through the byte-layout fast paths the first pass taught it. The
decoder must never raise, and the chunk must hold together:

* every rejection's reason is one of :data:`~kelp.consumers.codec.REASONS`;
* a record is accepted (its offset among ``row_offsets``) or rejected, or it is
  a columnar batch of zero samples;
* columns agree in length, ids per feature add up, dense values and labels are finite.

Kept to a few seconds: a modest ``max_examples`` per strategy and no deadline.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kelp.config import DenseFeature, FeatureSpec, SparseFeature
from kelp.consumers.codec import REASONS, encode_columns, encode_sample
from kelp.consumers.decode import Decoder, Rec

SPEC = FeatureSpec(
    dense=[DenseFeature(name="x", transforms=["log1p"]), DenseFeature(name="y", default=1.0)],
    sparse=[SparseFeature(name="a"), SparseFeature(name="b", max_ids=3), SparseFeature(name="c", table="a")],
)
FUZZ = settings(
    max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.sampled_from(["x", "y", "a", "b", "c", "values", "lengths", "z"]) | st.text(max_size=3),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)
FIELDS = ["v", "label", "ts", "dense", "sparse", "batch"]


@st.composite
def shaped_messages(draw: st.DrawFn) -> bytes:
    """A msgpack map with schema-v1's field names (mostly ``v: 1``) and anything as their values."""
    msg: dict[Any, Any] = {}
    for name in FIELDS:
        if draw(st.booleans()):
            msg[name] = draw(values)
    if draw(st.integers(0, 3)):
        msg["v"] = 1
    if draw(st.booleans()):
        msg["batch"] = draw(st.integers(-2, 4))
    if draw(st.booleans()):
        msg[draw(st.text(max_size=4) | st.integers(-(2**63), 2**64 - 1))] = draw(values)
    return msgpack.packb(msg, use_bin_type=draw(st.booleans()))


@st.composite
def valid_messages(draw: st.DrawFn) -> bytes:
    n = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    ids = {f: rng.integers(0, 2**64, n, dtype=np.uint64) for f in ("a", "b", "c")}
    kind = draw(st.sampled_from(["packed", "lists", "single"]))
    if kind == "single":
        return encode_sample(
            float(rng.integers(0, 2)), [1.0, 2.0], {f: int(v[0]) for f, v in ids.items()}, ts=1.5
        )
    return encode_columns(
        rng.integers(0, 2, n).astype(np.float32),
        rng.random((n, 2)),
        ids,
        ts=rng.random(n),
        packed=kind == "packed",
    )


@st.composite
def mutated_messages(draw: st.DrawFn) -> bytes:
    """A valid message with a few bytes flipped, cut off or inserted."""
    raw = bytearray(draw(valid_messages()))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "cut", "insert"]))
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        if op == "flip" and raw:
            raw[at] ^= draw(st.integers(1, 255))
        elif op == "cut":
            del raw[at:]
        else:
            raw[at:at] = draw(st.binary(min_size=1, max_size=4))
    return bytes(raw)


def _check_run(raws: list[bytes]) -> None:
    records = [Rec("events", 0, 100 + i, raw) for i, raw in enumerate(raws)]
    decoder = Decoder(SPEC, max_message_bytes=4096)
    for _ in range(2):  # the second pass reads learned layouts straight from the bytes
        chunk = decoder.decode(records)
        for rej in chunk.rejections:
            assert rej.reason in REASONS, rej
            assert isinstance(rej.detail, str) and rej.rows >= 0
        b = chunk.size
        assert chunk.dense.shape == (b, 2) and chunk.ts.shape == (b,) and chunk.row_offsets.shape == (b,)
        assert np.isfinite(chunk.labels).all() and np.isfinite(chunk.dense).all()
        for name in ("a", "b", "c"):
            assert chunk.lengths[name].shape == (b,)
            assert int(chunk.lengths[name].sum()) == len(chunk.values[name])
        assert (chunk.lengths["b"] <= 3).all()
        seen = set(chunk.row_offsets.tolist()) | {r.offset for r in chunk.rejections}
        for rec in records:
            if rec.offset not in seen:  # neither accepted nor rejected: only an empty batch
                msg = msgpack.unpackb(rec.value, raw=False, strict_map_key=False)
                assert isinstance(msg, dict) and msg.get("batch") == 0, (rec.value, chunk.rejections)


@FUZZ
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=4))
def test_random_bytes(raws: list[bytes]) -> None:
    _check_run(raws)


@settings(FUZZ, max_examples=100)
@given(st.lists(shaped_messages(), min_size=1, max_size=4))
def test_messages_of_any_shape(raws: list[bytes]) -> None:
    _check_run(raws)


@FUZZ
@given(st.lists(st.one_of(valid_messages(), mutated_messages()), min_size=1, max_size=5))
def test_valid_messages_with_damage(raws: list[bytes]) -> None:
    _check_run(raws)
