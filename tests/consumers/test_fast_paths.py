"""The decoder's fast paths (packed columnar runs, plain single-sample messages) change nothing.

Each run of records is decoded with the fast paths and with them switched
off (every message then goes through ``read_columnar`` or ``read_singles``),
and both chunks must be equal: same rows in the same order, same values,
same rejections with the same reasons and details. With the fast paths on,
the run is decoded twice by one decoder: the second time, plain messages
whose byte layout the first one taught it are read straight from their bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kelp.config import DenseFeature, FeatureSpec, SparseFeature
from kelp.consumers import batcher, columnar, decode, layouts
from kelp.consumers.codec import encode_columns, encode_sample
from kelp.consumers.decode import Chunk, Decoder, Rec

SPEC = FeatureSpec(
    dense=[DenseFeature(name="x", default=2.0, transforms=["log1p"]), DenseFeature(name="y")],
    sparse=[SparseFeature(name="a"), SparseFeature(name="b"), SparseFeature(name="c", table="a")],
)
NAMES = ["a", "b", "c"]


def _ids(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {f: rng.integers(0, 2**64, n, dtype=np.uint64) for f in NAMES}


def _packed(n: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return encode_columns(
        rng.integers(0, 2, n).astype(np.float32), rng.random((n, 2)), _ids(n, seed), ts=rng.random(n)
    )


def _plain(seed: int, **changes: Any) -> bytes:
    rng = np.random.default_rng(seed)
    msg: dict[str, Any] = {
        "v": 1,
        "label": float(rng.integers(0, 2)),
        "ts": float(rng.random()),
        "dense": rng.random(2).tolist(),
        "sparse": {f: int(v[0]) for f, v in _ids(1, seed).items()},
    }
    msg.update(changes)
    return msgpack.packb({k: v for k, v in msg.items() if v is not _DROP}, use_bin_type=True)


_DROP = object()

# Message makers (seed -> bytes): the fast forms, near misses of them, and bad records of all kinds.
MAKERS: dict[str, Callable[[int], bytes]] = {
    "packed": lambda s: _packed(1 + s % 7, s),
    "packed_3": lambda s: _packed(3, s),
    "packed_3_reordered": lambda s: encode_columns(
        np.ones(3), np.zeros((3, 2)), dict(reversed(_ids(3, s).items())), ts=np.zeros(3)
    ),
    "packed_no_ts": lambda s: encode_columns(np.ones(3), np.zeros((3, 2)), _ids(3, s)),
    "packed_scalar_ts": lambda s: encode_columns(np.ones(2), np.zeros((2, 2)), _ids(2, s), ts=5.0),
    "packed_no_dense": lambda s: encode_columns(np.zeros(2), None, _ids(2, s)),
    "packed_bad_label": lambda s: encode_columns(np.array([1.0, 3.0]), np.zeros((2, 2)), _ids(2, s)),
    "packed_nan_dense": lambda s: encode_columns(np.ones(2), np.array([[np.nan, 0], [1, 1]]), _ids(2, s)),
    "packed_missing_feature": lambda s: encode_columns(np.ones(2), None, {"a": _ids(2, s)["a"]}),
    "packed_short_bin": lambda s: msgpack.packb(
        {**msgpack.unpackb(_packed(3, s)), "label": b"\x00" * 8}, use_bin_type=True
    ),
    "packed_unknown_feature": lambda s: encode_columns(
        np.ones(1), None, {**_ids(1, s), "zz": _ids(1, s)["a"]}
    ),
    "list_columnar": lambda s: encode_columns(np.ones(2), np.ones((2, 2)), _ids(2, s), packed=False),
    "plain": _plain,
    "plain_int_label": lambda s: _plain(s, label=1),
    "plain_small_ids": lambda s: _plain(
        s, sparse={"a": s % 100, "b": 300 + s, "c": 70_000 + s}, dense=[1, 2.5]
    ),
    # Same length as other plain messages, other structure or values a learned layout must refuse:
    "plain_int_dense": lambda s: _plain(s, dense=[1, 2]),
    "plain_negative_dense": lambda s: _plain(s, dense=[1, -1]),
    "plain_swapped_keys": lambda s: _plain(s, sparse={"b": 1 + s, "a": 2 + s, "c": 3 + s}),
    "plain_in_order": lambda s: _plain(s, sparse={"a": 1 + s, "b": 2 + s, "c": 3 + s}),
    "plain_v2": lambda s: _plain(s, v=2),
    "plain_float32": lambda s: msgpack.packb(
        msgpack.unpackb(_plain(s)), use_bin_type=True, use_single_float=True
    ),
    "plain_no_ts": lambda s: _plain(s, ts=_DROP),
    "plain_no_dense": lambda s: _plain(s, dense=_DROP),
    "plain_bool_label": lambda s: _plain(s, label=True),
    "plain_bad_label": lambda s: _plain(s, label=2.0),
    "plain_inf_dense": lambda s: _plain(s, dense=[float("inf"), 0.0]),
    "plain_none_dense": lambda s: _plain(s, dense=[None, 1.0]),
    "plain_short_dense": lambda s: _plain(s, dense=[1.0]),
    "plain_dict_dense": lambda s: _plain(s, dense={"y": 1.0}),
    "plain_keys_reordered": lambda s: _plain(s, sparse={"c": 1, "a": 2, "b": 3}),
    "plain_missing_feature": lambda s: _plain(s, sparse={"a": 1, "b": 2}),
    "plain_unknown_feature": lambda s: _plain(s, sparse={"a": 1, "b": 2, "zz": 3}),
    "plain_bool_id": lambda s: _plain(s, sparse={"a": 1, "b": True, "c": 3}),
    "plain_float_id": lambda s: _plain(s, sparse={"a": 1, "b": 2.0, "c": 3}),
    "plain_negative_id": lambda s: _plain(s, sparse={"a": 1, "b": -2, "c": 3}),
    "plain_str_id": lambda s: _plain(s, sparse={"a": 1, "b": "two", "c": 3}),
    "plain_list_id": lambda s: _plain(s, sparse={"a": 1, "b": [2], "c": 3}),
    "sample_dict_dense": lambda s: encode_sample(1, {"x": 1.0}, {"a": 1}),
    "bad_msgpack": lambda s: b"\xc1",
}


def _decode(values: list[bytes], fast: bool) -> Chunk:
    records = [Rec("t", 0, 100 + i, v) for i, v in enumerate(values)]
    with pytest.MonkeyPatch.context() as m:
        if not fast:
            m.setattr(columnar.PackedRun, "add", lambda self, msg, tag: False)
            m.setattr(decode, "read_plain", lambda layout, msgs, tags: (None, msgs, tags))
            m.setattr(layouts.PlainLayouts, "__bool__", lambda self: False)
            return Decoder(SPEC, 1_000_000).decode(records)
        decoder = Decoder(SPEC, 1_000_000)
        first = decoder.decode(records)  # learns the layouts of the plain messages in the run
        _same(first, decoder.decode(records))
        return first


def _same(fast: Chunk, slow: Chunk) -> None:
    assert (fast.first_offset, fast.last_offset, fast.nbytes) == (
        slow.first_offset,
        slow.last_offset,
        slow.nbytes,
    )
    np.testing.assert_array_equal(fast.row_offsets, slow.row_offsets)
    np.testing.assert_array_equal(fast.labels, slow.labels)
    np.testing.assert_array_equal(fast.dense, slow.dense)  # NaN == NaN here
    np.testing.assert_array_equal(fast.ts, slow.ts)
    for f in NAMES:
        np.testing.assert_array_equal(fast.values[f], slow.values[f])
        np.testing.assert_array_equal(fast.lengths[f], slow.lengths[f])
        assert fast.values[f].dtype == np.uint64 and fast.lengths[f].dtype == np.int32
    assert fast.labels.dtype == slow.labels.dtype and fast.dense.dtype == slow.dense.dtype
    key = [(r.reason, r.detail, r.offset, r.rows, r.value) for r in fast.rejections]
    assert key == [(r.reason, r.detail, r.offset, r.rows, r.value) for r in slow.rejections]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(MAKERS)), st.integers(0, 1000)), min_size=1, max_size=12))
def test_fast_paths_decode_exactly_like_the_general_ones(picks: list[tuple[str, int]]) -> None:
    values = [MAKERS[name](seed) for name, seed in picks]
    _same(_decode(values, True), _decode(values, False))


def test_fast_paths_take_the_forms_they_are_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """Guards the test above: the fast paths do read their forms (else it compares slow to slow)."""
    taken: list[str] = []
    add, plain = columnar.PackedRun.add, decode.read_plain

    def spy_add(self: columnar.PackedRun, msg: dict[str, Any], tag: int) -> bool:
        ok = add(self, msg, tag)
        taken.append(f"packed:{ok}")
        return ok

    def spy_plain(layout: Any, msgs: list[dict[str, Any]], tags: list[int]) -> Any:
        cols, rest, rest_tags = plain(layout, msgs, tags)
        taken.append(f"plain:{len(msgs) - len(rest)}")
        return cols, rest, rest_tags

    monkeypatch.setattr(columnar.PackedRun, "add", spy_add)
    monkeypatch.setattr(decode, "read_plain", spy_plain)
    chunk = Decoder(SPEC, None).decode(
        [Rec("t", 0, i, v) for i, v in enumerate([_packed(4, 1), _plain(2), _plain(3, dense=_DROP)])]
    )
    assert chunk.size == 6 and not chunk.rejections
    assert taken == ["packed:True", "plain:2"]
    taken.clear()
    decoder = Decoder(SPEC, None)
    decoder.decode([Rec("t", 0, 0, _plain(7))])  # learns the layout
    again = decoder.decode(
        [Rec("t", 0, i, _plain(8 + i)) for i in range(3)] + [Rec("t", 0, 3, _plain(9, ts=_DROP))]
    )
    assert again.size == 4 and taken == ["plain:1", "plain:1"]  # three read from their bytes
    decoder.decode([Rec("t", 0, 0, _packed(4, 1))])  # learns the packed layout
    taken.clear()
    again = decoder.decode([Rec("t", 0, i, _packed(4, 2 + i)) for i in range(3)])
    assert again.size == 12 and taken == []  # all three read from their bytes, none unpacked


def test_plain_run_with_a_negative_id_falls_back_whole() -> None:
    """A negative id passes the plain form's type checks; the run's uint64 conversion refuses it."""
    values = [_plain(1), _plain(2, sparse={"a": 1, "b": -2, "c": 3}), _plain(3)]
    chunk = Decoder(SPEC, None).decode([Rec("t", 0, i, v) for i, v in enumerate(values)])
    assert chunk.size == 2 and [(r.reason, r.offset) for r in chunk.rejections] == [("bad_id", 1)]


@settings(max_examples=60, deadline=None)
@given(
    picks=st.lists(st.tuples(st.sampled_from(sorted(MAKERS)), st.integers(0, 1000)), min_size=1, max_size=12),
    per_chunk=st.integers(1, 5),
    batch_size=st.integers(1, 20),
)
def test_batches_cut_from_fast_path_chunks_are_the_same(
    picks: list[tuple[str, int]], per_chunk: int, batch_size: int
) -> None:
    """One-hot chunks from the fast paths are sliced without id offsets; batches must not change."""
    values = [MAKERS[name](seed) for name, seed in picks]

    def batches(fast: bool) -> list[Any]:
        decoder = Decoder(SPEC, 1_000_000)
        cutter = batcher.Batcher(SPEC, batch_size, 60.0)
        out = []
        with pytest.MonkeyPatch.context() as m:
            if not fast:
                m.setattr(batcher, "is_one_id_each", lambda lengths: False)
            for lo in range(0, len(values), per_chunk):
                run = [Rec("t", 0, lo + i, v) for i, v in enumerate(values[lo : lo + per_chunk])]
                cutter.add(decoder.decode(run))
                while (emitted := cutter.take()) is not None:
                    out.append(emitted)
            while (emitted := cutter.take(force=True)) is not None:
                out.append(emitted)
        return out

    fast, slow = batches(True), batches(False)
    assert len(fast) == len(slow)
    for a, b in zip(fast, slow, strict=True):
        assert a.handled == b.handled and (a.batch is None) == (b.batch is None)
        if a.batch is None:
            continue
        assert a.batch.sources == b.batch.sources
        np.testing.assert_array_equal(a.batch.labels, b.batch.labels)
        for f in NAMES:
            np.testing.assert_array_equal(a.batch.sparse[f].values, b.batch.sparse[f].values)
            np.testing.assert_array_equal(a.batch.sparse[f].offsets, b.batch.sparse[f].offsets)
            assert a.batch.sparse[f].offsets.dtype == np.int32
