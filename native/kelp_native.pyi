"""Kelp's native batch work (native/src/lib.rs): per-batch scans that release the GIL."""

from typing_extensions import Buffer

def take_rows(
    buf: Buffer, cursor: int, got: int, limit: int, width: int
) -> tuple[bytes, bytes, int, int, bool]:
    """Take row replies from ``buf[:got]`` at ``cursor``, at most ``limit``.

    Returns ``(nil, value_at, cursor, count, foreign)``: one 0/1 byte per record taken (1: nil),
    a little-endian i64 per value (where its ``width`` bytes start in ``buf``), the new cursor,
    how many records were taken, and whether the scan stopped at a reply that is no such record.
    """
