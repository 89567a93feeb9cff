"""Kelp's native batch work (native/src/lib.rs, sketch.rs): per-batch passes that release the GIL."""

from collections.abc import Sequence

from typing_extensions import Buffer

def take_rows(
    buf: Buffer, cursor: int, got: int, limit: int, width: int
) -> tuple[bytes, bytes, int, int, bool]:
    """Take row replies from ``buf[:got]`` at ``cursor``, at most ``limit``.

    Returns ``(nil, value_at, cursor, count, foreign)``: one 0/1 byte per record taken (1: nil),
    a little-endian i64 per value (where its ``width`` bytes start in ``buf``), the new cursor,
    how many records were taken, and whether the scan stopped at a reply that is no such record.
    """

def sketch_add(counts: Buffer, ids: Buffer, inc: int | Buffer, seeds: Sequence[int], mask: int) -> None:
    """Add ``inc`` to each id's cell ``splitmix64(id ^ seeds[d]) & mask`` in every row ``d`` of ``counts``.

    ``counts``: a writable, C-contiguous uint32 ``[len(seeds), mask + 1]`` array (``mask + 1`` a
    power of two), updated in place with wrapping adds; ``ids``: a C-contiguous uint64 buffer;
    ``inc``: one int in ``[0, 2**32)`` for all ids, or a uint32 buffer with one per id. The GIL is
    released while it runs; a buffer, ``inc`` or ``mask`` that does not fit raises ValueError before
    anything is written.
    """

def sketch_estimate(counts: Buffer, ids: Buffer, seeds: Sequence[int], mask: int, out: Buffer) -> None:
    """Write into ``out`` (writable uint32, one per id) each id's minimum over the rows of its cells.

    ``counts``, ``ids``, ``seeds`` and ``mask`` as for :func:`sketch_add` (``counts`` may be
    read-only here); ``out`` must not share memory with them. The GIL is released while it runs;
    a buffer or ``mask`` that does not fit raises ValueError.
    """
