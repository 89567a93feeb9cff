"""kelp_native.IdMap and the IdIndex that wraps it: the hot tier's and SlotTable's id -> slot map.

Checked against a plain-Python model: a dict from (tag, id) to the list of its
entries' values in the order a lookup meets them. One insert call of absent keys
puts several values of one key in the order last given first; a lookup reads
the front, a removal frees it (an id given twice in one removal frees one entry,
and both get its value). Random batches of inserts, removals and re-inserts
(tombstones), tags, growth from a tiny capacity; then edge cases and bad inputs,
which must raise ValueError before the map changes.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kelp_native import ID_MAP_MAX_TAG, IdMap

from kelp.store.rows.index import MAX_TAG, IdIndex

U64_MAX = 2**64 - 1


class Model:
    """The map's meaning in plain Python."""

    def __init__(self) -> None:
        self.entries: dict[tuple[int, int], list[int]] = {}

    def lookup(self, ids: list[int], tags: list[int]) -> list[int]:
        return [self.entries.get((t, i), [-1])[0] for i, t in zip(ids, tags, strict=True)]

    def insert(self, ids: list[int], vals: list[int], tags: list[int]) -> None:
        for i, v, t in zip(ids, vals, tags, strict=True):
            self.entries.setdefault((t, i), []).insert(0, v)

    def delete(self, ids: list[int], tags: list[int]) -> list[int]:
        out = self.lookup(ids, tags)
        for key in {(t, i) for i, t in zip(ids, tags, strict=True)}:
            if self.entries.get(key):
                self.entries[key].pop(0)
                if not self.entries[key]:
                    del self.entries[key]
        return out

    def __len__(self) -> int:
        return sum(len(v) for v in self.entries.values())


def _batch(rng: np.random.Generator, pool: np.ndarray, n: int) -> np.ndarray:
    return pool[rng.integers(0, len(pool), size=n)]


@pytest.mark.parametrize("tagged", [False, True])
def test_random_batches_match_the_model(tagged: bool) -> None:
    rng = np.random.default_rng(17 + tagged)
    pool = np.concatenate(
        [
            rng.integers(0, U64_MAX, size=3000, dtype=np.uint64, endpoint=True),
            np.arange(200, dtype=np.uint64),
            np.array([0, U64_MAX, U64_MAX - 1], np.uint64),
        ]
    )
    index, model, nxt = IdIndex(4), Model(), 0
    sizes = [index._map.table_len]
    for step in range(60):
        n = int(rng.integers(0, 400))
        ids = _batch(rng, pool, n)
        tags = rng.integers(0, 4 if step % 3 else MAX_TAG + 1, size=n).astype(np.uint8) if tagged else None
        tag_list = tags.tolist() if tags is not None else [0] * n
        if step % 4 == 3:
            got = index.delete(ids, tags)
            assert got.dtype == np.int64
            assert got.tolist() == model.delete(ids.tolist(), tag_list)
        else:
            # Only absent keys, as callers do; a few repeated within the call.
            absent = index.lookup(ids, tags) < 0
            ids, tag_list = ids[absent], [t for t, a in zip(tag_list, absent, strict=True) if a]
            if tags is not None:
                tags = tags[absent]
            vals = np.arange(nxt, nxt + len(ids), dtype=np.int64)
            nxt += len(ids)
            index.insert(ids, vals, tags)
            model.insert(ids.tolist(), vals.tolist(), tag_list)
        probe = _batch(rng, pool, 500)
        ptags = rng.integers(0, 4, size=500).astype(np.uint8) if tagged else None
        want = model.lookup(probe.tolist(), ptags.tolist() if ptags is not None else [0] * 500)
        assert index.lookup(probe, ptags).tolist() == want
        assert len(index) == index.size == len(model)
        sizes.append(index._map.table_len)
    assert sizes[-1] > sizes[0], "the table never grew"
    keys, vals = index.items()
    assert keys.dtype == np.uint64 and vals.dtype == np.int64
    want_items = sorted((i, v) for (_, i), vs in model.entries.items() for v in vs)
    assert sorted(zip(keys.tolist(), vals.tolist(), strict=True)) == want_items


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ins", "del"]),
            st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40)), max_size=30),
        ),
        max_size=25,
    )
)
def test_any_sequence_matches_the_model(ops: list[tuple[str, list[tuple[int, int]]]]) -> None:
    index, model, nxt = IdIndex(1), Model(), 0
    for op, pairs in ops:
        tags = [t for t, _ in pairs]
        ids = [i for _, i in pairs]
        if op == "ins":
            keep = [k for k, p in enumerate(pairs) if (p[0], p[1]) not in model.entries]
            ids, tags = [ids[k] for k in keep], [tags[k] for k in keep]
            vals = list(range(nxt, nxt + len(ids)))
            nxt += len(ids)
            index.insert(np.array(ids, np.uint64), np.array(vals), tags=np.array(tags, np.uint8))
            model.insert(ids, vals, tags)
        else:
            got = index.delete(np.array(ids, np.uint64), tags=np.array(tags, np.int64))
            assert got.tolist() == model.delete(ids, tags)
        assert len(index) == len(model)
    probe = [(t, i) for t in range(4) for i in range(41)]
    got = index.lookup(np.array([i for _, i in probe], np.uint64), np.array([t for t, _ in probe]))
    assert got.tolist() == model.lookup([i for _, i in probe], [t for t, _ in probe])


def test_an_id_given_twice_in_one_insert_is_found_as_given_last() -> None:
    index = IdIndex(4)
    index.insert(np.array([5, 9, 5, 5], np.uint64), np.array([1, 2, 3, 4]))
    assert len(index) == 4
    assert index.lookup(np.array([5, 9], np.uint64)).tolist() == [4, 2]
    assert index.delete(np.array([5, 5], np.uint64)).tolist() == [4, 4]
    assert len(index) == 3
    assert index.lookup(np.array([5], np.uint64)).tolist() == [3]
    # A rehash keeps that order.
    index.insert(np.arange(100, 200, dtype=np.uint64), np.arange(100))
    assert index.lookup(np.array([5], np.uint64)).tolist() == [3]
    assert index.delete(np.array([5], np.uint64)).tolist() == [3]
    assert index.lookup(np.array([5], np.uint64)).tolist() == [1]


def test_untagged_is_tag_zero_and_every_tag_is_its_own_key() -> None:
    index = IdIndex()
    all_tags = np.arange(MAX_TAG + 1, dtype=np.uint8)
    ids = np.full(len(all_tags), 7, np.uint64)
    index.insert(ids, np.arange(len(all_tags)) * 10, tags=all_tags)
    assert index.lookup(ids, all_tags).tolist() == (np.arange(len(all_tags)) * 10).tolist()
    assert index.lookup(np.array([7], np.uint64)).tolist() == [0]
    assert index.delete(np.array([7], np.uint64)).tolist() == [0]
    assert index.lookup(np.array([7, 7], np.uint64), np.array([0, 1])).tolist() == [-1, 10]
    assert MAX_TAG == ID_MAP_MAX_TAG == 253


def test_steady_churn_reuses_tombstones_without_unbounded_growth() -> None:
    index = IdIndex(1000)
    live = np.arange(1000, dtype=np.uint64)
    index.insert(live, np.arange(1000))
    sizes = set()
    for step in range(1, 50):
        fresh = np.arange(step * 1000, step * 1000 + 1000, dtype=np.uint64)
        assert (index.delete(live) >= 0).all()
        index.insert(fresh, np.arange(1000))
        live = fresh
        sizes.add(index._map.table_len)
    assert len(index) == 1000
    assert max(sizes) <= 8192
    assert (index.lookup(live) == np.arange(1000)).all()
    assert (index.lookup(np.arange(1000, dtype=np.uint64)) == -1).all()


def test_empty_arrays() -> None:
    index = IdIndex()
    empty = np.empty(0, np.uint64)
    assert index.lookup(empty).dtype == np.int64 and index.lookup(empty).shape == (0,)
    assert index.lookup(empty, np.empty(0, np.uint8)).shape == (0,)
    assert index.delete(empty).shape == (0,)
    index.insert(empty, np.empty(0, np.int64))
    index.insert(empty, [], tags=np.array([1, 2]))  # nothing to insert: tags are not checked
    keys, vals = index.items()
    assert keys.shape == vals.shape == (0,) and len(index) == 0


def test_converted_inputs_lists_other_dtypes_and_strided_views() -> None:
    index = IdIndex()
    ids = np.arange(40, dtype=np.uint64) * np.uint64(2**40)
    vals = np.arange(80, dtype=np.int32)[::2]
    tags = np.arange(80, dtype=np.int64)[::2] % 5
    index.insert(ids[::-1], vals[::-1], tags=tags[::-1])
    assert index.lookup(ids, tags).tolist() == list(range(0, 80, 2))
    assert index.lookup(ids.astype(np.int64), tags.astype(np.int16)).tolist() == list(range(0, 80, 2))
    assert index.lookup([int(ids[1])], [int(tags[1])]).tolist() == [2]
    assert index.lookup(ids[::3], tags[::3]).tolist() == vals[::3].tolist()
    assert index.delete(ids[1::3], tags[1::3]).tolist() == vals[1::3].tolist()
    tags_bool = np.zeros(3, bool)
    assert index.lookup(ids[:3], tags_bool).tolist() == [0, -1, -1]


@pytest.mark.parametrize(
    "tags",
    [np.array([0, 254], np.uint8), np.array([255, 0], np.uint8), np.array([-1, 0]), np.array([0, 300])],
)
def test_tags_out_of_range_raise_before_anything_changes(tags: np.ndarray) -> None:
    index = IdIndex()
    index.insert(np.array([1], np.uint64), np.array([5]))
    ids = np.array([1, 2], np.uint64)
    for call in (
        lambda: index.insert(ids, np.array([8, 9]), tags=tags),
        lambda: index.lookup(ids, tags),
        lambda: index.delete(ids, tags),
    ):
        with pytest.raises(ValueError, match=r"tags must be in \[0, 253\]"):
            call()
    assert len(index) == 1 and index.lookup(ids).tolist() == [5, -1]


def test_tags_of_another_length_raise() -> None:
    index = IdIndex()
    ids = np.array([1, 2], np.uint64)
    with pytest.raises(ValueError, match="1 tags for 2 ids"):
        index.lookup(ids, np.array([0], np.uint8))
    with pytest.raises(ValueError, match="3 tags for 2 ids"):
        index.insert(ids, np.array([1, 2]), tags=np.array([0, 0, 0]))
    with pytest.raises(ValueError, match=r"IdMap\.insert: 1 vals for 2 ids"):
        index.insert(ids, np.array([1]))
    assert len(index) == 0


def _bad_map_calls() -> list[tuple[str, object]]:
    ids = np.arange(4, dtype=np.uint64)
    out = np.empty(4, np.int64)
    ro = np.empty(4, np.int64)
    ro.flags.writeable = False
    shared = np.zeros(8, np.uint64)
    m = IdMap(8)
    return [
        ("int64 ids", lambda: m.lookup(ids.astype(np.int64), None, out)),
        ("uint32 ids", lambda: m.lookup(ids.astype(np.uint32), None, out)),
        ("a list of ids", lambda: m.lookup([0, 1, 2, 3], None, out)),
        ("non-contiguous ids", lambda: m.lookup(np.arange(8, dtype=np.uint64)[::2], None, out)),
        ("int64 tags", lambda: m.lookup(ids, np.zeros(4, np.int64), out)),
        ("tags too short", lambda: m.lookup(ids, np.zeros(3, np.uint8), out)),
        ("tag 254", lambda: m.lookup(ids, np.full(4, 254, np.uint8), out)),
        ("float out", lambda: m.lookup(ids, None, np.empty(4))),
        ("out too short", lambda: m.lookup(ids, None, np.empty(3, np.int64))),
        ("read-only out", lambda: m.lookup(ids, None, ro)),
        ("out over ids", lambda: m.lookup(shared[:4], None, shared[2:6].view(np.int64))),
        ("int32 vals", lambda: m.insert(ids, np.zeros(4, np.int32), None)),
        ("vals too long", lambda: m.insert(ids, np.zeros(5, np.int64), None)),
        ("uint8 ids to delete", lambda: m.delete(ids.astype(np.uint8), None, out)),
        ("delete out over tags", lambda: m.delete(ids, shared.view(np.uint8)[:4], shared.view(np.int64)[:4])),
        ("items of the wrong length", lambda: m.items(np.empty(1, np.uint64), np.empty(1, np.int64))),
    ]


@pytest.mark.parametrize(("why", "call"), _bad_map_calls(), ids=[c[0] for c in _bad_map_calls()])
def test_the_native_map_refuses_bad_buffers(why: str, call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]


def test_a_refused_call_leaves_the_map_as_it_was() -> None:
    m = IdMap(8)
    m.insert(np.array([3], np.uint64), np.array([30], np.int64), None)
    with pytest.raises(ValueError):
        m.insert(np.array([4, 5], np.uint64), np.array([1, 2], np.int64), np.array([1, 254], np.uint8))
    out = np.empty(3, np.int64)
    m.lookup(np.array([3, 4, 5], np.uint64), None, out)
    assert out.tolist() == [30, -1, -1] and len(m) == 1


def test_lookups_run_alongside_other_threads() -> None:
    """Two threads looking up in two maps at once get what one alone gets (the GIL is released)."""
    rng = np.random.default_rng(3)
    ids = rng.integers(0, U64_MAX, size=200_000, dtype=np.uint64, endpoint=True)
    maps = [IdIndex(len(ids)) for _ in range(2)]
    for m in maps:
        m.insert(ids, np.arange(len(ids)))
    outs: list[np.ndarray] = [np.empty(0, np.int64)] * 2

    def look(k: int) -> None:
        outs[k] = maps[k].lookup(ids[::-1])

    threads = [threading.Thread(target=look, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for out in outs:
        np.testing.assert_array_equal(out, np.arange(len(ids))[::-1])


def test_a_table_too_large_raises_memory_error() -> None:
    with pytest.raises(MemoryError, match="IdMap"):
        IdIndex(2**62)
    with pytest.raises(MemoryError, match="IdMap"):
        IdMap(2**63 - 1)
    assert IdMap(-5).table_len == 16 == IdIndex(0)._map.table_len
