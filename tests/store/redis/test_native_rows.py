"""kelp_native.take_rows_into: the row-reply scan read_rows runs, on crafted reply buffers.

Each buffer is checked against what the RESP rules say, written out by hand, and against
:func:`_reference`, a small pure-Python walk written here from the same rules: from the
cursor, records chain end to start; each is ``$-1\\r\\n`` or ``_\\r\\n`` (nil) or
``$<width>\\r\\n`` + ``width`` bytes + CRLF (a value); anything else at a record start is a
foreign reply, unless its head is not all here yet (``_`` alone, ``$`` with fewer bytes
than the longer of ``$-1\\r\\n`` and the value header), which, like a value whose bytes
are not all here, ends the scan to wait for more.
"""

from __future__ import annotations

import random
import threading
from typing import Any, NamedTuple

import numpy as np
import pytest
from kelp_native import take_rows_into


class Taken(NamedTuple):
    nil: list[bool]
    value_at: list[int]
    cursor: int
    count: int
    foreign: bool


def _take(buf: Any, limit: int, width: int, cursor: int = 0, got: int | None = None) -> Taken:
    """The native scan of ``buf``, checked against :func:`_reference`: the same flags, cursor, count
    and foreign stop, and each value's bytes copied from where the reference found it."""
    got = len(memoryview(buf).cast("B")) if got is None else got
    present = np.zeros(limit, dtype=np.uint8)
    values = np.zeros(limit * width, dtype=np.uint8)
    end, count, stored, foreign = take_rows_into(buf, cursor, got, limit, width, present, values, 0, 0)
    expected = _reference(bytes(memoryview(buf).cast("B")), cursor, got, limit, width)
    raw = bytes(memoryview(buf).cast("B"))
    copied = [values[i * width : (i + 1) * width].tobytes() for i in range(stored)]
    assert copied == [raw[at : at + width] for at in expected.value_at]
    nil = (present[:count] == 0).tolist()
    assert Taken(nil, expected.value_at, end, count, foreign) == expected
    return expected


def _reference(buf: bytes, cursor: int, got: int, limit: int, width: int) -> Taken:
    header = b"$%d\r\n" % width
    record = len(header) + width + 2
    nil: list[bool] = []
    value_at: list[int] = []
    foreign = False
    while len(nil) < limit and cursor < got:
        room = buf[cursor:got]
        if room.startswith(b"_\r\n"):
            nil.append(True)
            cursor += 3
        elif room.startswith(b"$-1\r\n"):
            nil.append(True)
            cursor += 5
        elif room.startswith(header):
            if len(room) < record:
                break
            if room[record - 2 : record] != b"\r\n":
                foreign = True
                break
            nil.append(False)
            value_at.append(cursor + len(header))
            cursor += record
        else:
            waiting = (room[:1] == b"_" and len(room) < 3) or (
                room[:1] == b"$" and len(room) < max(5, len(header))
            )
            foreign = not waiting
            break
    return Taken(nil, value_at, cursor, len(nil), foreign)


def _value(v: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(v), v)


def test_values_only() -> None:
    buf = _value(b"abcd") + _value(b"efgh") + _value(b"ijkl")
    assert _take(buf, 10, 4) == Taken([False] * 3, [4, 14, 24], 30, 3, False)


def test_nils_of_both_kinds_between_values() -> None:
    buf = b"$-1\r\n" + _value(b"ab") + b"_\r\n" + b"_\r\n" + _value(b"cd") + b"$-1\r\n"
    assert _take(buf, 10, 2) == Taken([True, False, True, True, False, True], [9, 23], 32, 6, False)


def test_a_value_whose_bytes_look_like_records_is_one_value() -> None:
    tricky = [b"$-1\r\n_\r\n$13\r\n", b"_\r\n$$$$$$$$\r\n", b"\r\n\r\n\r\n\r\n\r\n\r\n_"]
    assert {len(v) for v in tricky} == {13}
    buf = b"".join(_value(v) for v in tricky) + b"_\r\n"
    taken = _take(buf, 10, 13)
    assert taken == Taken([False, False, False, True], [5, 25, 45], 63, 4, False)
    assert [buf[at : at + 13] for at in taken.value_at] == tricky


def test_a_value_not_all_received_waits_whatever_its_head_looks_like() -> None:
    buf = _value(b"abcdefgh") + _value(b"$-1\r\n_\r\n")
    whole = _take(buf, 10, 8)
    assert whole == Taken([False, False], [4, 18], 28, 2, False)
    for got in range(15, 28):  # the second record's head whole, its value or CRLF not
        assert _take(buf, 10, 8, got=got) == Taken([False], [4], 14, 1, False)


def test_a_head_not_all_received_waits_and_a_whole_one_that_is_no_record_is_foreign() -> None:
    width = 10000  # header "$10000\r\n": longer than "$-1\r\n", so "$-1\r\n" prefixes wait less
    for partial in [b"_", b"_\r", b"$", b"$-", b"$-1", b"$-1\r", b"$1", b"$1000", b"$10000\r", b"$9999\r"]:
        assert _take(partial, 5, width) == Taken([], [], 0, 0, False), partial
    for foreign in [b"_x", b"_\rx", b"$9999\r\n", b"$1000\r\nx", b"$-2\r\n\r\n"]:
        assert _take(foreign + b"\0" * 8, 5, width) == Taken([], [], 0, 0, True), foreign
    assert _take(b"$-1\r\n", 5, width) == Taken([True], [], 5, 1, False)


def test_a_foreign_reply_at_the_start() -> None:
    replies = [b"-LOADING loading\r\n", b":1\r\n", b"+OK\r\n", b"*2\r\n", b"%1\r\n", b"$5\r\nabcde\r\n"]
    for reply in replies:
        assert _take(reply + _value(b"abcd"), 5, 4) == Taken([], [], 0, 0, True), reply


def test_a_foreign_reply_after_some_records_stops_there_with_them_taken() -> None:
    head = _value(b"abcd") + b"_\r\n" + b"$-1\r\n"
    buf = head + b"-WRONGTYPE Operation against a key\r\n" + _value(b"efgh")
    assert _take(buf, 10, 4) == Taken([False, True, True], [4], len(head), 3, True)
    other_width = head + _value(b"abcde")
    assert _take(other_width, 10, 4) == Taken([False, True, True], [4], len(head), 3, True)


def test_a_value_without_its_crlf_is_foreign() -> None:
    buf = _value(b"abcd") + b"$4\r\nefghXY" + _value(b"ijkl")
    assert _take(buf, 10, 4) == Taken([False], [4], 10, 1, True)


def test_limit_stops_before_records_that_are_here() -> None:
    buf = (_value(b"ab") + b"_\r\n") * 4
    assert _take(buf, 3, 2) == Taken([False, True, False], [4, 15], 19, 3, False)
    assert _take(buf, 0, 2) == Taken([], [], 0, 0, False)


def test_from_a_cursor_and_up_to_got() -> None:
    buf = _value(b"ab") + _value(b"cd") + b"_\r\n" + _value(b"ef")
    assert _take(buf, 10, 2, cursor=8) == Taken([False, True, False], [12, 23], 27, 3, False)
    assert _take(buf, 10, 2, cursor=8, got=19) == Taken([False, True], [12], 19, 2, False)
    assert _take(buf, 10, 2, cursor=27) == Taken([], [], 27, 0, False)


def test_width_edge_cases() -> None:
    one = _value(b"$") + _value(b"_") + b"_\r\n" + _value(b"\r")
    assert _take(one, 10, 1) == Taken([False, False, True, False], [4, 11, 21], 24, 4, False)
    assert _take(b"$0\r\n\r\n_\r\n", 10, 0) == Taken([False, True], [4], 9, 2, False)
    width = 10000  # the widest value whose header "$10000\r\n" is 8 bytes
    big = _value(bytes(range(256)) * 39 + b"$-1\r\n_\r\n" + b"x" * 8) + b"$-1\r\n" + _value(b"y" * width)
    taken = _take(big, 10, width)
    assert taken == Taken([False, True, False], [8, 10023], len(big), 3, False)
    assert _take(big, 10, width, got=len(big) - 1) == Taken([False, True], [8], 10015, 2, False)


def test_random_reply_streams_cut_anywhere_match_the_reference() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        width = rng.choice([0, 1, 2, 5, 16, 80])
        records = []
        for _ in range(rng.randint(0, 10)):
            kind = rng.random()
            if kind < 0.3:
                records.append(rng.choice([b"_\r\n", b"$-1\r\n"]))
            elif kind < 0.95:
                records.append(_value(bytes(rng.choice(b"$_\r\n-1x") for _ in range(width))))
            else:
                records.append(rng.choice([b"-ERR x\r\n", _value(b"z" * (width + 1))]))
        buf = b"".join(records)
        got = rng.randint(0, len(buf))
        cursor = rng.randint(0, got) if rng.random() < 0.2 else 0
        _take(buf, rng.randint(0, 12), width, cursor=cursor, got=got)


def test_any_contiguous_buffer_is_read_and_bounds_are_checked() -> None:
    buf = _value(b"ab") + b"_\r\n"
    expected = Taken([False, True], [4], 11, 2, False)
    assert _take(bytearray(buf), 5, 2) == expected
    assert _take(memoryview(bytearray(buf + b"spare")), 5, 2, got=len(buf)) == expected
    assert _take(np.frombuffer(buf, np.uint8), 5, 2) == expected
    present, values = np.zeros(5, np.uint8), np.zeros(10, np.uint8)
    with pytest.raises(ValueError, match="got <= len"):
        take_rows_into(buf, 0, len(buf) + 1, 5, 2, present, values, 0, 0)
    with pytest.raises(ValueError, match="cursor <= got"):
        take_rows_into(buf, 5, 4, 5, 2, present, values, 0, 0)


def test_threads_scan_their_own_buffers_at_once() -> None:
    """The scan runs without the GIL: threads walking big buffers together each get their own records."""
    values = [bytes([i]) * 80 for i in range(4)]
    bufs = [(_value(v) + b"_\r\n") * 20_000 for v in values]
    results: list[tuple[list[bool], set[bytes], int, int, bool] | None] = [None] * 4

    def scan(i: int) -> None:
        present, copied = np.zeros(40_000, np.uint8), np.zeros(40_000 * 80, np.uint8)
        buf = bufs[i]
        end, count, stored, foreign = take_rows_into(buf, 0, len(buf), 40_000, 80, present, copied, 0, 0)
        rows = {copied[k * 80 : (k + 1) * 80].tobytes() for k in range(stored)}
        results[i] = ((present[:count] == 0).tolist(), rows, end, count, foreign)

    threads = [threading.Thread(target=scan, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, got in enumerate(results):
        assert got is not None
        nil, rows, end, count, foreign = got
        assert count == 40_000 and not foreign and end == len(bufs[i])
        assert nil == [False, True] * 20_000
        assert rows == {values[i]}
