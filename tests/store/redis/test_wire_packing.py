"""The numpy-packed RESP commands of the buckets layout, checked against hiredis's own packing."""

from __future__ import annotations

import hiredis
import numpy as np

from kelp.store.redis._wire.packing import pack_commands, pack_grouped, pack_runs


def _hiredis(*args: bytes) -> bytes:
    return hiredis.pack_command(args)


def test_grouped_commands_are_what_hiredis_would_send_one_command_per_run_of_rows() -> None:
    keys = np.array([b"k1", b"k2", b"k1", b"k1", b"k2"], "V2")
    group = np.array([1, 2, 1, 1, 2])
    fields = np.array([b"a", b"b", b"c", b"d", b"e"], "V1")
    values = np.array([b"AA", b"BB", b"CC", b"DD", b"EE"], "V2")
    cmds = pack_grouped(("HSET",), group, keys, fields, values, max_rows=2)
    # group 1 has 3 rows: split into 2 + 1; group 2 has 2. Commands of one size go out together.
    expected = [
        _hiredis(b"HSET", b"k1", b"d", b"DD"),
        _hiredis(b"HSET", b"k1", b"a", b"AA", b"c", b"CC"),
        _hiredis(b"HSET", b"k2", b"b", b"BB", b"e", b"EE"),
    ]
    assert cmds.count == 3
    assert b"".join(cmds) == b"".join(expected)


def test_grouped_commands_pack_again_identically_in_small_parts_for_a_retry() -> None:
    rng = np.random.default_rng(0)
    n = 5000
    group = rng.integers(0, 300, n)
    keys = group.astype(">u4").view("V4")
    fields = np.arange(n, dtype=">u8").view("V8")
    cmds = pack_grouped(("HSET",), group, keys, fields, fields, part_rows=100)
    first = list(cmds)
    assert len(first) > 10  # sent as it is packed, not as one block
    assert list(cmds) == first  # a retried pipeline iterates again
    assert b"".join(first).count(b"HSET") == cmds.count == len(np.unique(group))


def test_per_row_commands_match_hiredis() -> None:
    keys = np.array([b"key", b"kez"], "V3")
    fields = np.array([b"\x00\x01", b"\xff\r"], "V2")
    assert pack_commands(("HGET",), keys, fields) == _hiredis(b"HGET", b"key", b"\x00\x01") + _hiredis(
        b"HGET", b"kez", b"\xff\r"
    )


def test_runs_of_rows_are_what_hiredis_would_send_one_command_per_run() -> None:
    rng = np.random.default_rng(5)
    lengths = np.array([1, 9, 10, 0, 100, 3])
    n = int(lengths.sum())
    keys = rng.integers(0, 256, (n, 12), dtype=np.uint8).view("V12").ravel()
    values = rng.integers(0, 256, (n, 80), dtype=np.uint8).view("V80").ravel()
    want, at = [], 0
    for k in lengths.tolist():
        args = [a for i in range(at, at + k) for a in (keys[i].tobytes(), values[i].tobytes())]
        want.append(hiredis.pack_command(("MSET", *args)))
        at += k
    assert pack_runs(("MSET",), lengths, keys, values) == b"".join(want)
    assert pack_runs(("MGET",), lengths[:2], keys[:10]) == hiredis.pack_command(
        ("MGET", keys[0].tobytes())
    ) + hiredis.pack_command(("MGET", *(k.tobytes() for k in keys[1:10])))
