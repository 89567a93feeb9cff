"""kelp_native.sketch_add / sketch_estimate: the hot tier's count-min sketch, done in Rust.

Checked against :func:`_ref_add` / :func:`_ref_estimate`, the numpy code the sketch ran
before (``np.add.at`` per row into cells ``splitmix64(id ^ seed) & mask``, with
:func:`kelp.store.rows.hashing.splitmix64`), on random ids (0, 2**64-1 and repeats
included), per-id and scalar increments, several depths and widths, and wrapping at 2**32;
then bad inputs, which must raise ValueError before anything is written.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
from kelp_native import sketch_add, sketch_estimate

from kelp.store.hot.sketch import CountMinSketch
from kelp.store.rows.hashing import splitmix64

U64_MAX = 2**64 - 1


def _ref_cells(ids: np.ndarray, seeds: list[int], mask: int) -> list[np.ndarray]:
    return [(splitmix64(ids ^ np.uint64(s)) & np.uint64(mask)).astype(np.intp) for s in seeds]


def _ref_add(counts: np.ndarray, ids: np.ndarray, inc: np.ndarray | int, seeds: list[int], mask: int) -> None:
    inc = np.broadcast_to(np.asarray(inc, dtype=np.uint32), ids.shape)
    for d, cells in enumerate(_ref_cells(ids, seeds, mask)):
        np.add.at(counts[d], cells, inc)


def _ref_estimate(counts: np.ndarray, ids: np.ndarray, seeds: list[int], mask: int) -> np.ndarray:
    cells = _ref_cells(ids, seeds, mask)
    out = counts[0][cells[0]]
    for d in range(1, len(seeds)):
        out = np.minimum(out, counts[d][cells[d]])
    return out


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random uint64 ids with the extremes and many repeats."""
    fresh = rng.integers(0, U64_MAX, size=n, dtype=np.uint64, endpoint=True)
    ids = np.concatenate([fresh, np.array([0, U64_MAX, 0, U64_MAX], np.uint64), fresh[: n // 3]])
    rng.shuffle(ids)
    return ids


def _seeds(rng: np.random.Generator, depth: int) -> list[int]:
    return [int(s) for s in rng.integers(0, U64_MAX, size=depth, dtype=np.uint64, endpoint=True)]


@pytest.mark.parametrize("depth", [1, 2, 4])
@pytest.mark.parametrize("width", [1, 64, 1024, 1 << 16])
def test_add_and_estimate_match_the_numpy_reference(depth: int, width: int) -> None:
    rng = np.random.default_rng(depth * 1_000_003 + width)
    seeds = _seeds(rng, depth)
    mask = width - 1
    got = np.zeros((depth, width), np.uint32)
    want = got.copy()
    for _ in range(3):
        ids = _ids(rng, 3000)
        inc = rng.integers(0, 1000, size=len(ids), dtype=np.uint32)
        sketch_add(got, ids, inc, seeds, mask)
        _ref_add(want, ids, inc, seeds, mask)
        sketch_add(got, ids, 3, seeds, mask)
        _ref_add(want, ids, 3, seeds, mask)
    np.testing.assert_array_equal(got, want)
    probe = np.concatenate([_ids(rng, 500), ids[:500]])
    out = np.full(len(probe), 7, np.uint32)
    sketch_estimate(got, probe, seeds, mask, out)
    np.testing.assert_array_equal(out, _ref_estimate(want, probe, seeds, mask))


def test_counters_wrap_at_2_32_as_numpy_does() -> None:
    seeds = [11, 22]
    mask = 63
    got = np.full((2, 64), 2**32 - 2, np.uint32)
    want = got.copy()
    ids = np.array([5, 5, 6, 0, U64_MAX], np.uint64)
    sketch_add(got, ids, np.array([1, 2, 2**32 - 1, 3, 4], np.uint32), seeds, mask)
    _ref_add(want, ids, np.array([1, 2, 2**32 - 1, 3, 4], np.uint32), seeds, mask)
    sketch_add(got, ids, 2**32 - 1, seeds, mask)
    _ref_add(want, ids, 2**32 - 1, seeds, mask)
    np.testing.assert_array_equal(got, want)
    out = np.empty(len(ids), np.uint32)
    sketch_estimate(got, ids, seeds, mask, out)
    np.testing.assert_array_equal(out, _ref_estimate(want, ids, seeds, mask))


def test_empty_ids_change_nothing() -> None:
    counts = np.zeros((2, 64), np.uint32)
    sketch_add(counts, np.empty(0, np.uint64), 1, [1, 2], 63)
    sketch_add(counts, np.empty(0, np.uint64), np.empty(0, np.uint32), [1, 2], 63)
    out = np.empty(0, np.uint32)
    sketch_estimate(counts, np.empty(0, np.uint64), [1, 2], 63, out)
    assert not counts.any()


def test_the_class_matches_its_numpy_reference_with_halving() -> None:
    rng = np.random.default_rng(5)
    sk = CountMinSketch(width=4096, depth=4, window=20_000, seed="t")
    want = np.zeros((4, 4096), np.uint32)
    added = 0
    for step in range(12):
        ids = _ids(rng, 2000)
        inc: np.ndarray | int = rng.integers(1, 4, size=len(ids)) if step % 2 else 2
        sk.add(ids, inc)
        _ref_add(want, ids, inc, sk._seeds, sk.width - 1)
        added += int(np.broadcast_to(np.asarray(inc), ids.shape).sum())
        while added >= sk.window:
            want >>= 1
            added -= sk.window
        np.testing.assert_array_equal(sk._counts, want)
        probe = _ids(rng, 300)
        np.testing.assert_array_equal(sk.estimate(probe), _ref_estimate(want, probe, sk._seeds, sk.width - 1))
    assert sk.halvings > 0
    assert sk.estimate(np.array([], np.uint64)).shape == (0,)
    assert sk.estimate(np.array([[1, 2], [3, 4]], np.uint64)).shape == (2, 2)


def test_add_runs_alongside_other_threads() -> None:
    """Two sketches filled from two threads at once end as one filled alone (GIL released)."""
    rng = np.random.default_rng(9)
    ids = _ids(rng, 50_000)
    seeds = [1, 2, 3, 4]
    want = np.zeros((4, 1 << 16), np.uint32)
    _ref_add(want, ids, 1, seeds, (1 << 16) - 1)
    tables = [np.zeros_like(want) for _ in range(2)]
    threads = [threading.Thread(target=sketch_add, args=(t, ids, 1, seeds, (1 << 16) - 1)) for t in tables]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for t in tables:
        np.testing.assert_array_equal(t, want)


def _bad_cases() -> list[tuple[str, dict[str, object]]]:
    good = {
        "counts": np.zeros((2, 64), np.uint32),
        "ids": np.arange(10, dtype=np.uint64),
        "inc": np.ones(10, np.uint32),
        "seeds": [1, 2],
        "mask": 63,
    }
    ro = np.zeros((2, 64), np.uint32)
    ro.flags.writeable = False
    shared = np.zeros((2, 64), np.uint32)
    return [
        ("read-only counts", {**good, "counts": ro}),
        ("int64 counts", {**good, "counts": np.zeros((2, 64), np.int64)}),
        ("uint64 counts", {**good, "counts": np.zeros((2, 64), np.uint64)}),
        ("1-d counts", {**good, "counts": np.zeros(128, np.uint32)}),
        ("depth not len(seeds)", {**good, "counts": np.zeros((3, 64), np.uint32)}),
        ("width not mask + 1", {**good, "counts": np.zeros((2, 128), np.uint32)}),
        ("mask + 1 not a power of two", {**good, "counts": np.zeros((2, 48), np.uint32), "mask": 47}),
        ("no seeds", {**good, "counts": np.zeros((0, 64), np.uint32), "seeds": []}),
        ("non-contiguous counts", {**good, "counts": np.zeros((2, 128), np.uint32)[:, ::2]}),
        ("int64 ids", {**good, "ids": np.arange(10, dtype=np.int64)}),
        ("uint32 ids", {**good, "ids": np.arange(10, dtype=np.uint32)}),
        ("a list of ids", {**good, "ids": list(range(10))}),
        ("inc shorter than ids", {**good, "inc": np.ones(9, np.uint32)}),
        ("inc longer than ids", {**good, "inc": np.ones(11, np.uint32)}),
        ("int64 inc", {**good, "inc": np.ones(10, np.int64)}),
        ("negative scalar inc", {**good, "inc": -1}),
        ("scalar inc over 2**32", {**good, "inc": 2**32}),
        ("ids sharing counts' memory", {**good, "counts": shared, "ids": shared.view(np.uint64)[0, :10]}),
    ]


@pytest.mark.parametrize(("why", "kw"), _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_sketch_add_refuses_bad_inputs(why: str, kw: dict[str, object]) -> None:
    counts = kw["counts"]
    before = np.array(counts, copy=True)
    with pytest.raises(ValueError, match="sketch"):
        sketch_add(kw["counts"], kw["ids"], kw["inc"], kw["seeds"], kw["mask"])
    np.testing.assert_array_equal(np.asarray(counts), before)


def test_sketch_estimate_refuses_bad_inputs() -> None:
    counts = np.zeros((2, 64), np.uint32)
    ids = np.arange(10, dtype=np.uint64)
    ro = np.zeros(10, np.uint32)
    ro.flags.writeable = False
    for out in [np.zeros(9, np.uint32), np.zeros(10, np.int32), ro, counts[0, :10]]:
        with pytest.raises(ValueError, match="sketch"):
            sketch_estimate(counts, ids, [1, 2], 63, out)
    with pytest.raises(ValueError, match="sketch"):
        sketch_estimate(counts, ids, [1, 2, 3], 63, np.zeros(10, np.uint32))
    with pytest.raises(ValueError, match="sketch"):
        sketch_estimate(counts.astype(np.float32), ids, [1, 2], 63, np.zeros(10, np.uint32))


def test_sketch_estimate_reads_read_only_counters() -> None:
    counts = np.zeros((2, 64), np.uint32)
    ids = np.array([3, 0, U64_MAX], np.uint64)
    sketch_add(counts, ids, 4, [1, 2], 63)
    counts.flags.writeable = False
    out = np.empty(3, np.uint32)
    sketch_estimate(counts, ids, [1, 2], 63, out)
    np.testing.assert_array_equal(out, _ref_estimate(counts, ids, [1, 2], 63))
