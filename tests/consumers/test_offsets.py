"""Contiguous-durable commit bookkeeping under out-of-order durable marks."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kelp.consumers.offsets import OffsetTracker


@given(st.lists(st.integers(1, 20), min_size=1, max_size=40), st.randoms())
def test_position_is_end_of_longest_durable_prefix(sizes: list[int], rnd) -> None:  # type: ignore[no-untyped-def]
    tracker = OffsetTracker()
    ends, start = [], 100
    for n in sizes:
        start += n
        ends.append(start - 1)
        tracker.register("p", start - 1)
    order = list(range(len(ends)))
    rnd.shuffle(order)
    done: set[int] = set()
    last_reported = None
    for i in order[: len(order) // 2 + 1]:
        tracker.mark_durable("p", ends[i])
        done.add(i)
        prefix = 0
        while prefix in done:
            prefix += 1
        expected = ends[prefix - 1] + 1 if prefix else None
        assert tracker.positions().get("p") == expected
        got = tracker.committable().get("p")
        if expected is not None and expected != last_reported:
            assert got == expected
            last_reported = expected
        else:
            assert got is None


def test_forgotten_partition_ignores_late_marks() -> None:
    tracker = OffsetTracker()
    tracker.register(("t", 0, 1), 9)
    tracker.forget([("t", 0, 1)])
    assert tracker.mark_durable(("t", 0, 1), 9) is False
    assert tracker.committable() == {}


def test_register_rejects_non_increasing_ends() -> None:
    import pytest

    tracker = OffsetTracker()
    tracker.register("p", 5)
    with pytest.raises(ValueError):
        tracker.register("p", 5)
