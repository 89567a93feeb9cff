"""kelp_native.take_rows_into / pack_rows / take_ints_into: bit for bit what the code they replace
computed.

``take_rows_into`` is checked against ``_reference``, the pure-Python RESP walk of
tests/store/redis/test_native_rows.py (where each record's value starts), followed by a numpy
gather of the values; ``pack_rows`` against the structured-array records ``pack_commands`` filled
column by column and copied with ``tobytes()``; ``take_ints_into`` against the numpy parse of
integer replies it replaced. Random replies (values, both nils, partial records, foreign replies)
and random columns, then bad buffers.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kelp_native import pack_rows, take_ints_into, take_rows_into

from kelp.store.redis._wire.packing import pack_commands, pack_runs


def _replies(rng: random.Random, n: int, width: int) -> bytes:
    """``n`` row replies of ``width`` bytes (values holding ``$`` and CRLF too), nils of both kinds."""
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.2:
            out.append(b"$-1\r\n")
        elif kind < 0.3:
            out.append(b"_\r\n")
        else:
            value = bytes(rng.choice(b"$_\r\n-ab0") for _ in range(width))
            out.append(b"$%d\r\n%s\r\n" % (width, value))
    return b"".join(out)


def _load_reference() -> Any:
    """``_reference`` of the RESP walk's own tests (one pure-Python statement of the rules, not two)."""
    path = Path(__file__).parents[1] / "store" / "redis" / "test_native_rows.py"
    spec = importlib.util.spec_from_file_location("_kelp_resp_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module._reference


_reference = _load_reference()


def _numpy_take(buf: bytes, cursor: int, got: int, limit: int, width: int) -> tuple[Any, ...]:
    """The reference walk's value offsets, then a numpy gather of the values out of the buffer."""
    nil, value_at, end, count, foreign = _reference(buf, cursor, got, limit, width)
    at = np.asarray(value_at, dtype=np.int64)
    data = np.frombuffer(buf, dtype=np.uint8)
    values = np.lib.stride_tricks.sliding_window_view(data, width)[at] if len(at) else data[:0]
    return [not n for n in nil], values.tobytes(), end, count, foreign


def _native_take(buf: bytes, cursor: int, got: int, limit: int, width: int) -> tuple[Any, ...]:
    present = np.full(limit, 7, dtype=np.uint8)
    values = np.zeros(limit * width, dtype=np.uint8)
    end, count, stored, foreign = take_rows_into(buf, cursor, got, limit, width, present, values, 0, 0)
    assert present[count:].tolist() == [7] * (limit - count)  # nothing written past what was taken
    return present[:count].view(np.bool_).tolist(), values[: stored * width].tobytes(), end, count, foreign


@pytest.mark.parametrize("width", [1, 5, 80])
def test_take_rows_into_matches_the_offsets_scan_and_gather(width: int) -> None:
    rng = random.Random(width)
    for _ in range(200):
        buf = _replies(rng, rng.randrange(0, 40), width)
        if rng.random() < 0.3:  # a foreign reply after some rows
            buf += rng.choice([b"-LOADING Redis is loading\r\n", b":1\r\n", b"$%d\r\nx\r\n" % (width + 1)])
        got = rng.randrange(0, len(buf) + 1)  # a cut anywhere: a record not all received yet waits
        cursor = 0
        limit = rng.randrange(0, 45)
        assert _native_take(buf, cursor, got, limit, width) == _numpy_take(buf, cursor, got, limit, width)


def test_take_rows_into_continues_where_the_last_call_stopped() -> None:
    """Chunks as the socket delivers them: each call appends to the flags and values already taken."""
    rng = random.Random(3)
    width, n = 16, 300
    buf = _replies(rng, n, width)
    present = np.zeros(n, dtype=np.uint8)
    values = np.zeros(n * width, dtype=np.uint8)
    cursor = taken = stored = 0
    for got in [*sorted(rng.sample(range(len(buf)), 25)), len(buf)]:
        left = n - taken
        cursor, k, s, foreign = take_rows_into(buf, cursor, got, left, width, present, values, taken, stored)
        assert not foreign
        taken, stored = taken + k, stored + s
    whole = _numpy_take(buf, 0, len(buf), n, width)
    assert (present.view(np.bool_).tolist(), values[: stored * width].tobytes(), cursor, taken) == whole[:4]


def test_take_rows_into_refuses_buffers_that_do_not_fit() -> None:
    buf = b"$2\r\nab\r\n"
    present, values = np.zeros(2, np.uint8), np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match="limit 3 does not fit"):
        take_rows_into(buf, 0, len(buf), 3, 2, present, values, 0, 0)
    with pytest.raises(ValueError, match="cursor <= got"):
        take_rows_into(buf, 0, len(buf) + 1, 1, 2, present, values, 0, 0)
    with pytest.raises(ValueError, match="writable"):
        take_rows_into(buf, 0, len(buf), 1, 2, np.frombuffer(b"\0\0", np.uint8), values, 0, 0)
    with pytest.raises(ValueError, match="share memory"):
        take_rows_into(buf, 0, len(buf), 1, 2, values[:2], values, 0, 0)


def _numpy_records(head: bytes, columns: tuple[np.ndarray, ...]) -> bytes:
    """The structured-array packing pack_commands ran before."""
    fields: list[tuple[str, Any]] = []
    values: list[tuple[str, Any]] = []
    prefix = head
    for i, col in enumerate(columns):
        width = col.dtype.itemsize
        prefix += f"${width}\r\n".encode()
        fields.append((f"s{i}", f"V{len(prefix)}"))
        values.append((f"s{i}", prefix))
        fields.append((f"c{i}", f"V{width}"))
        values.append((f"c{i}", col.view(f"V{width}")))
        prefix = b"\r\n"
    fields.append(("end", "V2"))
    values.append(("end", prefix))
    rec = np.empty(len(columns[0]), dtype=np.dtype(fields))
    for name, value in values:
        rec[name] = np.void(value) if isinstance(value, bytes) else value
    return rec.tobytes()


def _column(rng: np.random.Generator, n: int, width: int) -> np.ndarray:
    return np.frombuffer(rng.integers(0, 256, n * width, dtype=np.uint8).tobytes(), dtype=f"V{width}")


def test_pack_commands_matches_the_structured_array_records() -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 1000):
        keys, fields, values = _column(rng, n, 17), _column(rng, n, 8), _column(rng, n, 80)
        for words, cols in ((("HGET",), (keys, fields)), (("HSET",), (keys, fields, values))):
            head = f"*{len(words) + len(cols)}\r\n".encode() + b"".join(
                f"${len(w)}\r\n{w}\r\n".encode() for w in words
            )
            assert pack_commands(words, *cols) == _numpy_records(head, cols)
            picked = rng.permutation(n)[: n // 2]
            expected = _numpy_records(head, tuple(c[picked] for c in cols))
            assert pack_commands(words, *cols, rows=picked) == expected


def test_pack_commands_reads_strided_and_bytes_columns() -> None:
    keys = np.array([b"k1", b"k2", b"k3", b"k4"], dtype="S2")[::2]  # strided; S read as raw bytes
    fields = np.array([b"a\0", b"b\0"], dtype="V2")
    assert pack_commands(("HGET",), keys, fields) == (
        b"*3\r\n$4\r\nHGET\r\n$2\r\nk1\r\n$2\r\na\0\r\n*3\r\n$4\r\nHGET\r\n$2\r\nk3\r\n$2\r\nb\0\r\n"
    )
    runs = pack_runs(("MGET",), np.array([1, 1]), keys)
    assert runs == b"*2\r\n$4\r\nMGET\r\n$2\r\nk1\r\n*2\r\n$4\r\nMGET\r\n$2\r\nk3\r\n"


def test_pack_rows_refuses_columns_and_rows_that_do_not_fit() -> None:
    col = np.zeros(6, np.uint8)
    with pytest.raises(ValueError, match=r"columns\[0\] has 6 bytes, needs 4"):
        pack_rows(b"", [col], [2], 2)
    with pytest.raises(ValueError, match="1 columns for 2 widths"):
        pack_rows(b"", [col], [2, 1], 3)
    with pytest.raises(ValueError, match="row 3 out of range"):
        pack_rows(b"", [col], [2], 3, np.array([0, 3], np.int64))
    with pytest.raises(ValueError, match="every column needs one value"):
        pack_commands(("HSET",), np.zeros(2, "V1"), np.zeros(3, "V1"))


_COLON, _CR, _LF, _ZERO, _NINE = ord(":"), ord("\r"), ord("\n"), ord("0"), ord("9")


def _numpy_ints(data: np.ndarray, n: int) -> tuple[int, list[int], int]:
    """The numpy parse of integer replies that take_ints_into replaced: how many of the first ``n``
    lines are ``:<1-18 digits>\\r\\n`` in a row, their values, and the offset past the last."""
    ends = np.flatnonzero(data == _LF)[:n]
    if not len(ends):
        return 0, [], 0
    starts = np.r_[0, ends[:-1] + 1]
    digits = ends - starts - 2
    nondigit = np.r_[0, np.cumsum((data < _ZERO) | (data > _NINE))]
    valid = (
        (data[starts] == _COLON)
        & (data[ends - 1] == _CR)
        & (digits >= 1)
        & (digits <= 18)
        & (nondigit[ends + 1] - nondigit[starts] == 3)
    )
    good = len(valid) if valid.all() else int(np.argmin(valid))
    if not good:
        return 0, [], 0
    values = [int(bytes(data[s + 1 : e - 1])) for s, e in zip(starts[:good], ends[:good], strict=True)]
    return good, values, int(ends[good - 1]) + 1


def test_take_ints_into_matches_the_numpy_parse() -> None:
    rng = random.Random(11)
    lines = [b":0\r\n", b":1\r\n", b":64\r\n", b":%d\r\n" % (10**18 - 1), b":%d\r\n" % 10**18, b":\r\n"]
    lines += [b":-1\r\n", b"-ERR x\r\n", b"+OK\r\n", b":1\n", b":1\r\r\n", b":1x\r\n", b"$1\r\na\r\n"]
    for _ in range(2000):
        buf = b"".join(rng.choice(lines[:4]) if rng.random() < 0.85 else rng.choice(lines) for _ in range(8))
        n = rng.randrange(0, 10)
        out = np.full(max(n, 1), -7, dtype=np.int64)
        end, good, _ = take_ints_into(buf, 0, len(buf), n, out)
        assert (good, out[:good].tolist(), end) == _numpy_ints(np.frombuffer(buf, np.uint8), n), buf


def test_take_ints_into_waits_for_a_partial_line_and_refuses_buffers_that_do_not_fit() -> None:
    out = np.zeros(3, np.int64)
    assert take_ints_into(b":5\r\n:6", 0, 6, 3, out) == (4, 1, False)
    assert take_ints_into(b":5\r\n:6\r\n", 4, 8, 3, out) == (8, 1, False) and out[0] == 6
    with pytest.raises(ValueError, match="limit 4 does not fit"):
        take_ints_into(b":1\r\n", 0, 4, 4, out)
    with pytest.raises(ValueError, match="cursor <= got"):
        take_ints_into(b":1\r\n", 0, 5, 1, out)
    with pytest.raises(ValueError, match="writable"):
        take_ints_into(b":1\r\n", 0, 4, 1, np.frombuffer(bytes(8), np.int64))
