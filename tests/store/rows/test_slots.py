"""SlotTable: the one "id index + growable columns" (memory store, hot cache, serving cache, baseline)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kelp.store.rows import slots as slots_module
from kelp.store.rows.slots import Column, SlotTable


def _table(capacity: int = 4) -> SlotTable:
    return SlotTable(
        {
            "rows": Column(np.float32, width=3),
            "count": Column(np.uint32),
            "state": Column(np.float32, fill=0.5),
        },
        capacity=capacity,
    )


def test_insert_lookup_and_fill() -> None:
    t = _table()
    ids = np.array([10, 2**64 - 1, 0], np.uint64)
    slots = t.insert(ids, rows=np.arange(9, dtype=np.float32).reshape(3, 3), count=7)
    assert len(t) == 3 and sorted(slots.tolist()) == [0, 1, 2]
    assert t.lookup(np.array([0, 5, 10], np.uint64)).tolist() == [slots[2], -1, slots[0]]
    np.testing.assert_array_equal(t["rows"][slots[1]], [3, 4, 5])
    assert t["count"][slots].tolist() == [7, 7, 7]  # a scalar value for every row
    assert t["state"][slots].tolist() == [0.5, 0.5, 0.5]  # columns not named read their fill


def test_grows_by_doubling_and_keeps_values() -> None:
    t = _table(capacity=2)
    first = t.insert(np.arange(2, dtype=np.uint64), rows=np.ones((2, 3), np.float32))
    t.insert(np.arange(2, 7, dtype=np.uint64), rows=np.full((5, 3), 2.0, np.float32))
    assert t.capacity == 8 and len(t) == 7
    assert (t["rows"][first] == 1.0).all()
    (rows,) = t.read(t.lookup(np.arange(2, 7, dtype=np.uint64)), "rows")
    assert (rows == 2.0).all()


def test_removed_slots_are_reused_and_reset() -> None:
    t = _table(capacity=4)
    t.insert(np.arange(4, dtype=np.uint64), count=9)
    assert t.room == 0
    assert t.remove_ids(np.array([1, 3, 99], np.uint64)) == 2
    assert len(t) == 2 and t.n_free == 2 and t.room == 2
    assert t.lookup(np.array([1, 3], np.uint64)).tolist() == [-1, -1]
    again = t.insert(np.array([50, 51], np.uint64))
    assert sorted(again.tolist()) == [1, 3] and t.capacity == 4  # no growth: freed slots first
    assert t["count"][again].tolist() == [0, 0]  # a reused slot reads the fill, not the old value
    ids, slots = t.items()
    assert sorted(ids.tolist()) == [0, 2, 50, 51] and sorted(slots.tolist()) == [0, 1, 2, 3]


def test_unknown_column_is_refused_before_anything_changes() -> None:
    t = _table()
    with pytest.raises(KeyError, match="unknown column"):
        t.insert(np.array([1], np.uint64), nope=1)
    assert len(t) == 0 and t.high == 0


@pytest.mark.parametrize("host", [True, False], ids=["host-view", "device-path"])
def test_torch_columns_on_a_device(host: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU tensor column is written and read through a numpy view of its storage; ``device-path``
    takes the branch a CUDA column takes (torch indexing with an index tensor on its device)."""
    if not host:
        monkeypatch.setattr(slots_module, "host_view", lambda c: c if isinstance(c, np.ndarray) else None)
    t = SlotTable(
        {
            "w": Column(torch.float32, width=2, device="cpu"),
            "s": Column(torch.float32, fill=0.1, device="cpu"),
        },
        capacity=1,
    )
    slots = t.insert(np.array([4, 5, 6], np.uint64), w=np.ones((3, 2), np.float64))  # cast to the column
    assert isinstance(t["w"], torch.Tensor) and t["w"].dtype == torch.float32 and t.capacity == 4
    t.write(slots[:1], w=np.full((1, 2), 3.0, np.float32), s=0.2)
    w, s = t.read(slots, "w", "s")
    np.testing.assert_array_equal(w, [[3, 3], [1, 1], [1, 1]])
    np.testing.assert_allclose(s, [0.2, 0.1, 0.1])
    in_tensor = t["w"].index_select(0, torch.from_numpy(slots)).tolist()  # the tensor's own storage
    assert in_tensor == [[3, 3], [1, 1], [1, 1]]
    t.reserve(10)
    assert t.capacity == 16 and t["w"].shape == (16, 2)
    assert t.nbytes() == 16 * 2 * 4 + 16 * 4 + 16 * 8 + 16


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(0, 40), max_size=12)), max_size=25))
def test_matches_a_dict(ops: list[tuple[bool, list[int]]]) -> None:
    """Random inserts and removes agree with a plain dict of id -> value, through growth and reuse."""
    t = SlotTable({"v": Column(np.int64)}, capacity=2)
    model: dict[int, int] = {}
    for n, (add, raw) in enumerate(ops):
        ids = np.array(sorted(set(raw)), np.uint64)
        if add:
            new = ids[t.lookup(ids) < 0]
            t.insert(new, v=np.full(len(new), n))
            model.update(dict.fromkeys(new.tolist(), n))
        else:
            t.remove_ids(ids)
            for i in ids.tolist():
                model.pop(i, None)
        assert len(t) == len(model)
    keys = np.array(sorted(model), np.uint64)
    assert (t.lookup(keys) >= 0).all()
    assert t["v"][t.lookup(keys)].tolist() == [model[k] for k in sorted(model)]
    live_ids, _ = t.items()
    assert sorted(live_ids.tolist()) == sorted(model)


def test_a_reused_slot_is_refilled_only_in_columns_not_given() -> None:
    t = SlotTable({"rows": Column(np.float32, width=2), "hits": Column(np.uint32, fill=7)}, capacity=4)
    first = t.insert(np.array([1, 2], np.uint64), rows=np.full((2, 2), 5, np.float32), hits=3)
    t.remove(first[:1])
    again = t.insert(np.array([9, 10], np.uint64), rows=np.ones((2, 2), np.float32))
    assert again[0] == first[0]  # the freed slot first, then a fresh one
    assert t["hits"][again].tolist() == [7, 7]  # reused slot reset to the fill, fresh one born with it
    assert t["rows"][again].tolist() == [[1, 1], [1, 1]]
