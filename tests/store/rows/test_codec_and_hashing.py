"""Row codec (property-based), the id index, hashing and init rows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from kelp.config import InitSpec
from kelp.store.policy.initial_rows import init_rows
from kelp.store.rows.codec import BAD_HEADER, FAULT_REASONS, HEADER_BYTES, NONFINITE, WRONG_LENGTH, RowCodec
from kelp.store.rows.hashing import rendezvous
from kelp.store.rows.index import IdIndex

finite32 = st.floats(-60_000, 60_000, width=32)  # inside float16 range


@st.composite
def batches(draw: st.DrawFn) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
    dim = draw(st.integers(1, 40))
    n = draw(st.integers(0, 30))
    rows = draw(arrays(np.float32, (n, dim), elements=finite32))
    state = draw(arrays(np.float32, (n,), elements=st.floats(0, 65536, width=32)))
    missing = draw(arrays(np.bool_, (n,)))
    return dim, rows, state, missing


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from(["float32", "float16"]), st.integers(0, 2**32 - 1))
def test_codec_roundtrip(batch, dtype, updated) -> None:  # type: ignore[no-untyped-def]
    dim, rows, state, missing = batch
    codec = RowCodec(dim, dtype)
    values: list[bytes | None] = list(codec.encode(rows, state, count=3, updated_s=updated))
    assert all(len(v) == HEADER_BYTES + dim * (4 if dtype == "float32" else 2) for v in values)  # type: ignore[arg-type]
    for i in np.flatnonzero(missing):
        values[i] = None
    out = codec.decode(values)
    keep = ~missing
    assert out.present.tolist() == keep.tolist()
    expected = rows if dtype == "float32" else rows.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out.rows[keep], expected[keep])
    np.testing.assert_array_equal(out.state[keep], state[keep])
    assert (out.updated_s[keep] == updated).all() and (out.count[keep] == 3).all()
    assert (out.rows[missing] == 0).all()


def test_codec_marks_foreign_values_per_position_and_decodes_the_rest() -> None:
    """A value that is no valid row is marked in ``fault``; it never fails the batch."""
    codec = RowCodec(4)
    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    good = codec.encode(rows, np.ones(3, np.float32), updated_s=9)
    nan_row = codec.encode(np.array([[1, np.nan, 0, 0]], np.float32), np.zeros(1, np.float32))[0]
    inf_state = codec.encode(np.zeros((1, 4), np.float32), np.array([np.inf], np.float32))[0]
    f16 = RowCodec(4, "float16").encode(np.zeros((1, 4)), np.zeros(1))[0]
    values = [good[0], b"short", None, b"\x09" + good[1][1:], nan_row, inf_state, good[2], f16]
    out = codec.decode(values)
    assert out.present.tolist() == [True, True, False, True, True, True, True, True]
    assert out.fault.tolist() == [0, WRONG_LENGTH, 0, BAD_HEADER, NONFINITE, NONFINITE, 0, WRONG_LENGTH]
    np.testing.assert_array_equal(out.rows[[0, 6]], rows[[0, 2]])
    assert (out.updated_s[[0, 6]] == 9).all() and (out.rows[1] == 0).all()
    assert [FAULT_REASONS[f] for f in out.fault[:5]] == ["", "wrong_length", "", "bad_header", "nonfinite"]
    other_dim = RowCodec(2, "float32").encode(np.zeros((2, 2)), np.zeros(2))  # same length as dim-4 float16
    assert RowCodec(4, "float16").decode(other_dim).fault.tolist() == [BAD_HEADER, BAD_HEADER]


@settings(max_examples=100, deadline=None)
@given(batches(), st.data())
def test_codec_fault_mask_matches_a_per_value_check(batch, data) -> None:  # type: ignore[no-untyped-def]
    """The vectorised fault mask equals what a plain per-value check says, for any mix of values."""
    dim, rows, state, _ = batch
    codec = RowCodec(dim)
    values: list[bytes | None] = list(codec.encode(rows, state))
    expected = [0] * len(values)
    for i in range(len(values)):
        kind = data.draw(st.sampled_from(["good", "missing", "nan", "inf_state", "short", "version"]))
        v = values[i]
        assert v is not None
        if kind == "missing":
            values[i] = None
        elif kind == "nan":
            values[i] = v[:HEADER_BYTES] + np.float32(np.nan).tobytes() + v[HEADER_BYTES + 4 :]
            expected[i] = NONFINITE
        elif kind == "inf_state":
            values[i] = v[:12] + np.float32(-np.inf).tobytes() + v[16:]
            expected[i] = NONFINITE
        elif kind == "short":
            values[i] = v[:-1]
            expected[i] = WRONG_LENGTH
        elif kind == "version":
            values[i] = b"\x02" + v[1:]
            expected[i] = BAD_HEADER
    out = codec.decode(values)
    assert out.fault.tolist() == expected
    assert out.present.tolist() == [v is not None for v in values]
    fine = np.array([v is not None and e == 0 for v, e in zip(values, expected, strict=True)], dtype=bool)
    np.testing.assert_array_equal(out.rows[fine], rows[fine])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["ins", "del"]), st.lists(st.integers(0, 200), max_size=40)), max_size=30
    )
)
def test_index_matches_dict(ops) -> None:  # type: ignore[no-untyped-def]
    index, model, nxt = IdIndex(4), {}, 0
    for op, raw in ops:
        ids = np.unique(np.array(raw, dtype=np.uint64))
        if op == "ins":
            new = ids[index.lookup(ids) < 0]
            index.insert(new, np.arange(nxt, nxt + len(new)))
            model.update({int(i): nxt + k for k, i in enumerate(new)})
            nxt += len(new)
        else:
            index.delete(ids)
            for i in ids:
                model.pop(int(i), None)
    probe = np.arange(0, 201, dtype=np.uint64)
    assert index.lookup(probe).tolist() == [model.get(i, -1) for i in range(201)]
    assert len(index) == len(model)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ins", "del"]),
            st.lists(st.tuples(st.integers(0, 3), st.integers(0, 60)), max_size=40),
        ),
        max_size=30,
    )
)
def test_tagged_index_matches_a_dict_of_pairs(ops) -> None:  # type: ignore[no-untyped-def]
    """(tag, id) pairs: the same id under two tags is two keys; growing keeps every tag."""
    index, model, nxt = IdIndex(4), {}, 0
    for op, raw in ops:
        pairs = sorted(set(raw))
        tags = np.array([t for t, _ in pairs], dtype=np.int64)
        ids = np.array([i for _, i in pairs], dtype=np.uint64)
        if op == "ins":
            new = index.lookup(ids, tags=tags) < 0
            index.insert(ids[new], np.arange(nxt, nxt + int(new.sum())), tags=tags[new])
            added = zip(tags[new].tolist(), ids[new].tolist(), strict=True)
            model.update({(t, i): nxt + k for k, (t, i) in enumerate(added)})
            nxt += int(new.sum())
        else:
            index.delete(ids, tags=tags)
            for t, i in pairs:
                model.pop((t, i), None)
    tags, ids = np.divmod(np.arange(4 * 61), 61)
    got = index.lookup(ids.astype(np.uint64), tags=tags).tolist()
    assert got == [model.get((int(t), int(i)), -1) for t, i in zip(tags, ids, strict=True)]
    assert len(index) == len(model)


def test_rendezvous_moves_only_the_removed_shards_ids() -> None:
    ids = np.arange(20_000, dtype=np.uint64)
    seeds = np.array([11, 22, 33, 44], dtype=np.uint64)
    before = rendezvous(ids, seeds)
    assert np.bincount(before).min() > 4000  # balanced
    after = rendezvous(ids, seeds[[0, 1, 3]])
    remap = np.array([0, 1, -1, 2])
    kept = before != 2
    assert (after[kept] == remap[before[kept]]).all()


def test_init_rows_are_deterministic_and_distributed() -> None:
    ids = np.arange(50_000, dtype=np.uint64)
    normal = init_rows(InitSpec(kind="normal", std=0.1, seed=7), "t", ids, 16)
    np.testing.assert_array_equal(
        normal[123], init_rows(InitSpec(kind="normal", std=0.1, seed=7), "t", ids[123:124], 16)[0]
    )
    assert abs(normal.std() - 0.1) < 0.002 and abs(normal.mean()) < 0.002
    assert not np.array_equal(normal, init_rows(InitSpec(kind="normal", std=0.1, seed=8), "t", ids, 16))
    assert not np.array_equal(normal, init_rows(InitSpec(kind="normal", std=0.1, seed=7), "u", ids, 16))
    uni = init_rows(InitSpec(kind="uniform", scale=0.2), "t", ids, 3)
    assert uni.min() >= -0.2 and uni.max() <= 0.2 and abs(uni.mean()) < 0.003
